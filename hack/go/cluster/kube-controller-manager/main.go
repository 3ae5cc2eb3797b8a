// Command kube-controller-manager is upstream's kube-controller-manager, built from the
// k8s.io/kubernetes Go module for hack/cluster (every controller but the cloud ones, which our manager
// runs). It is test tooling only; the product is Rust.
package main

import (
	"os"
	_ "time/tzdata" // CronJob time zones, as upstream's main does

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	command := app.NewControllerManagerCommand()
	code := cli.Run(command)
	os.Exit(code)
}

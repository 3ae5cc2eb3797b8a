// Command kube-apiserver is upstream's kube-apiserver, built from the
// k8s.io/kubernetes Go module for the project's test control plane.
// It is test tooling only; the product is Rust.
package main

import (
	"os"
	_ "time/tzdata" // CronJob time zones, as upstream's main does

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	command := app.NewAPIServerCommand()
	code := cli.Run(command)
	os.Exit(code)
}

// Command coredns is CoreDNS with only the plugins a cluster's DNS needs (hack/cluster): the cluster's
// Services and pods from the API server, and the health, readiness, cache and logging plugins. Built
// from the github.com/coredns/coredns Go module, as CoreDNS documents for custom builds; test tooling
// only, the product is Rust.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins' order in a server block, as in CoreDNS's plugin.cfg.
var directives = []string{"ready", "health", "errors", "log", "cache", "kubernetes"}

func init() { dnsserver.Directives = directives }

func main() { coremain.Run() }

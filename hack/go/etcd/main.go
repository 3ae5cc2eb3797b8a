// Command etcd is upstream's etcd server, built from the go.etcd.io/etcd/server/v3
// Go module for the project's test control plane. Test tooling only.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

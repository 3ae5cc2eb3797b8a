// Package e2e pins the Go module versions hack/e2e builds upstream's end-to-end tests from: e2e.test
// (`go test -c k8s.io/kubernetes/test/e2e`), kubectl and agnhost, all from k8s.io/kubernetes at the
// version of the test API server (hack/go/kube-apiserver; hack/update-go-modules regenerates both).
// Test tooling only; the product is Rust.
package e2e

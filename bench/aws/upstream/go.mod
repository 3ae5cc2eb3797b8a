// Builds upstream's aws-cloud-controller-manager (k8s.io/cloud-provider-aws) unchanged, for bench/aws/run:
// `go build k8s.io/cloud-provider-aws/cmd/aws-cloud-controller-manager` in this module. No code of ours.
module ccm-rs/bench/aws/upstream

go 1.26.0

require k8s.io/cloud-provider-aws v1.37.0

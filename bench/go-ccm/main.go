// Command go-ccm is the benchmark peer: upstream's Go cloud-controller-manager (the sample main of
// k8s.io/cloud-provider) with upstream's in-memory fake provider registered as "fake", made to answer as
// the project's Rust fake does for the same node names: provider ID fake://<name>, instance type
// standard, zone zone-a, region region-1, one InternalIP derived from the name (FNV-1a, the same formula),
// load balancers with ingress IPs from 203.0.113.0/24, and the same simulated latency on every cloud call.
//
// Environment: BENCH_LATENCY (a Go duration, default 0) and BENCH_STATS_ADDR (host:port; serves /stats,
// the call counts and each load balancer's backend nodes, as JSON). Benchmark tooling only.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/fake"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/klog/v2"
)

// benchCloud wraps upstream's fake. Its own load-balancer and instance methods replace the fake's, which
// write their maps without a lock (unsafe with more than one worker) and skip the delay in
// OverrideInstanceMetadata.
type benchCloud struct {
	*fake.Cloud
	latency  time.Duration
	mu       sync.Mutex
	calls    map[string]int64
	backends map[string][]string
	ips      map[string]string
	nextIP   int
}

func (c *benchCloud) enter(method string) {
	c.mu.Lock()
	c.calls[method]++
	c.mu.Unlock()
	if c.latency > 0 {
		time.Sleep(c.latency)
	}
}

func derivedIP(name string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	v := h.Sum32()
	return fmt.Sprintf("10.%d.%d.%d", v>>24, (v>>16)&255, 1+((v>>8)&255)%254)
}

func key(s *v1.Service) string { return s.Namespace + "/" + s.Name }

func nodeNames(nodes []*v1.Node) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	sort.Strings(out)
	return out
}

func (c *benchCloud) ProviderName() string                             { return "fake" }
func (c *benchCloud) HasClusterID() bool                               { return true }
func (c *benchCloud) Instances() (cloudprovider.Instances, bool)       { return nil, false }
func (c *benchCloud) Zones() (cloudprovider.Zones, bool)               { return nil, false }
func (c *benchCloud) Routes() (cloudprovider.Routes, bool)             { return nil, false }
func (c *benchCloud) InstancesV2() (cloudprovider.InstancesV2, bool)   { return c, true }
func (c *benchCloud) LoadBalancer() (cloudprovider.LoadBalancer, bool) { return c, true }
func (c *benchCloud) InstanceExists(context.Context, *v1.Node) (bool, error) {
	c.enter("instance_exists")
	return true, nil
}
func (c *benchCloud) InstanceShutdown(context.Context, *v1.Node) (bool, error) {
	c.enter("instance_shutdown")
	return false, nil
}

func (c *benchCloud) InstanceMetadata(_ context.Context, node *v1.Node) (*cloudprovider.InstanceMetadata, error) {
	c.enter("instance_metadata")
	return &cloudprovider.InstanceMetadata{
		ProviderID:    "fake://" + node.Name,
		InstanceType:  "standard",
		Zone:          "zone-a",
		Region:        "region-1",
		NodeAddresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: derivedIP(node.Name)}},
	}, nil
}

func (c *benchCloud) status(ip string) *v1.LoadBalancerStatus {
	vip := v1.LoadBalancerIPModeVIP
	return &v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: ip, IPMode: &vip}}}
}

func (c *benchCloud) GetLoadBalancer(_ context.Context, _ string, s *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	c.enter("get_load_balancer")
	c.mu.Lock()
	defer c.mu.Unlock()
	ip, ok := c.ips[key(s)]
	if !ok {
		return nil, false, nil
	}
	return c.status(ip), true, nil
}

func (c *benchCloud) GetLoadBalancerName(_ context.Context, _ string, s *v1.Service) string {
	return cloudprovider.DefaultLoadBalancerName(s)
}

func (c *benchCloud) EnsureLoadBalancer(_ context.Context, _ string, s *v1.Service, nodes []*v1.Node) (*v1.LoadBalancerStatus, error) {
	c.enter("ensure_load_balancer")
	c.mu.Lock()
	defer c.mu.Unlock()
	ip, ok := c.ips[key(s)]
	if !ok {
		c.nextIP++
		ip = fmt.Sprintf("203.0.%d.%d", 113+(c.nextIP-1)/254, 1+(c.nextIP-1)%254)
		c.ips[key(s)] = ip
	}
	c.backends[key(s)] = nodeNames(nodes)
	return c.status(ip), nil
}

func (c *benchCloud) UpdateLoadBalancer(_ context.Context, _ string, s *v1.Service, nodes []*v1.Node) error {
	c.enter("update_load_balancer")
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backends[key(s)] = nodeNames(nodes)
	return nil
}

func (c *benchCloud) EnsureLoadBalancerDeleted(_ context.Context, _ string, s *v1.Service) error {
	c.enter("ensure_load_balancer_deleted")
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ips, key(s))
	delete(c.backends, key(s))
	return nil
}

func (c *benchCloud) serveStats(addr string) {
	http.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"calls": c.calls, "backends": c.backends})
	})
	go func() {
		if err := http.ListenAndServe(addr, nil); err != nil {
			klog.Fatalf("bench stats endpoint: %v", err)
		}
	}()
}

func newBenchCloud() *benchCloud {
	latency := time.Duration(0)
	if v := os.Getenv("BENCH_LATENCY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			klog.Fatalf("BENCH_LATENCY: %v", err)
		}
		latency = d
	}
	c := &benchCloud{
		Cloud:    &fake.Cloud{EnableInstancesV2: true, ExistsByProviderID: true, ExternalIP: net.ParseIP("203.0.113.1")},
		latency:  latency,
		calls:    map[string]int64{},
		backends: map[string][]string{},
		ips:      map[string]string{},
	}
	if addr := os.Getenv("BENCH_STATS_ADDR"); addr != "" {
		c.serveStats(addr)
	}
	return c
}

func main() {
	cloudprovider.RegisterCloudProvider("fake", func(io.Reader) (cloudprovider.Interface, error) {
		return newBenchCloud(), nil
	})
	ccmOptions, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		klog.Fatalf("unable to initialize command options: %v", err)
	}
	fss := cliflag.NamedFlagSets{}
	command := app.NewCloudControllerManagerCommand(ccmOptions, cloudInitializer, app.DefaultInitFuncConstructors, names.CCMControllerAliases(), fss, wait.NeverStop)
	os.Exit(cli.Run(command))
}

func cloudInitializer(config *config.CompletedConfig) cloudprovider.Interface {
	cloudConfig := config.ComponentConfig.KubeCloudShared.CloudProvider
	cloud, err := cloudprovider.InitCloudProvider(cloudConfig.Name, cloudConfig.CloudConfigFile)
	if err != nil {
		klog.Fatalf("Cloud provider could not be initialized: %v", err)
	}
	if cloud == nil {
		klog.Fatalf("Cloud provider is nil")
	}
	return cloud
}

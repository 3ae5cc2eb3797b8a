// Command go-ccm is the benchmark peer: upstream's Go cloud-controller-manager (the sample main of
// k8s.io/cloud-provider) with upstream's in-memory fake provider registered as "fake", made to answer as
// the project's Rust fake does for the same node names: provider ID fake://<name>, instance type
// standard, zone zone-a, region region-1, one InternalIP derived from the name (FNV-1a, the same formula),
// load balancers with ingress IPs from 203.0.113.0/24, and the same simulated latency on every cloud call.
//
// Environment: BENCH_LATENCY (a Go duration, default 0), BENCH_STATS_ADDR (host:port; serves /stats,
// the call counts and each load balancer's backend nodes, as JSON) and BENCH_FAKE_STATE_FILE (a path:
// the load balancers live in the Rust fake cloud's shared state file instead of memory, under the same
// lock protocol as its stateFileShared mode, so the Go peer and our manager see one cloud; see
// sharedState below). Benchmark and test tooling only; without BENCH_FAKE_STATE_FILE nothing changes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	shared   *sharedState
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
	seen := map[string]bool{}
	for _, n := range nodes {
		if !seen[n.Name] {
			seen[n.Name] = true
			out = append(out, n.Name)
		}
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

func (c *benchCloud) statusOf(ips []string) *v1.LoadBalancerStatus {
	vip := v1.LoadBalancerIPModeVIP
	status := &v1.LoadBalancerStatus{}
	for _, ip := range ips {
		status.Ingress = append(status.Ingress, v1.LoadBalancerIngress{IP: ip, IPMode: &vip})
	}
	return status
}

func (c *benchCloud) status(ip string) *v1.LoadBalancerStatus {
	vip := v1.LoadBalancerIPModeVIP
	return &v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: ip, IPMode: &vip}}}
}

func (c *benchCloud) GetLoadBalancer(_ context.Context, _ string, s *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	c.enter("get_load_balancer")
	if c.shared != nil {
		var found *lbRecord
		err := c.shared.read(func(st *stateFile) {
			if r := st.find(key(s)); r != nil {
				found = r
			}
		})
		if err != nil || found == nil {
			return nil, false, err
		}
		return c.statusOf(found.Ingress), true, nil
	}
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
	if c.shared != nil {
		var ingress []string
		err := c.shared.update(func(st *stateFile) error {
			r, err := st.ensure(s, nodeNames(nodes))
			if err == nil {
				ingress = r.Ingress
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.backends[key(s)] = nodeNames(nodes)
		c.mu.Unlock()
		return c.statusOf(ingress), nil
	}
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
	if c.shared != nil {
		err := c.shared.update(func(st *stateFile) error {
			r := st.find(key(s))
			if r == nil {
				return fmt.Errorf("fake cloud: no load balancer %s for service %s", cloudprovider.DefaultLoadBalancerName(s), key(s))
			}
			r.Nodes = nodeNames(nodes)
			return nil
		})
		if err != nil {
			return err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backends[key(s)] = nodeNames(nodes)
	return nil
}

func (c *benchCloud) EnsureLoadBalancerDeleted(_ context.Context, _ string, s *v1.Service) error {
	c.enter("ensure_load_balancer_deleted")
	if c.shared != nil {
		name := cloudprovider.DefaultLoadBalancerName(s)
		if err := c.shared.update(func(st *stateFile) error { st.remove(name); return nil }); err != nil {
			return err
		}
	}
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
	if path := os.Getenv("BENCH_FAKE_STATE_FILE"); path != "" {
		c.shared = &sharedState{path: path, lockPath: path + ".lock"}
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

// The Rust fake cloud's shared state file (providers/fake, stateFileShared), for the Go peer's load
// balancers: each change is made under an exclusive flock on <stateFile>.lock, on the state as the file
// holds it; the lock file holds a revision every writer bumps (written before the state file, which is
// replaced atomically by a rename); readers take the lock shared. Fields the Go peer does not manage
// (routes, calls, callsPerObject) are kept as they are.

type sharedState struct {
	path, lockPath string
}

type portRecord struct {
	Protocol string `json:"protocol"`
	Port     int32  `json:"port"`
	NodePort int32  `json:"nodePort"`
}

type lbRecord struct {
	Name    string       `json:"name"`
	Service string       `json:"service"`
	Ingress []string     `json:"ingress"`
	Ports   []portRecord `json:"ports"`
	Nodes   []string     `json:"nodes"`
}

type stateFile struct {
	other         map[string]json.RawMessage
	LoadBalancers []lbRecord
	IPAssignments map[string]string
}

func (st *stateFile) find(service string) *lbRecord {
	for i := range st.LoadBalancers {
		if st.LoadBalancers[i].Service == service {
			return &st.LoadBalancers[i]
		}
	}
	return nil
}

func (st *stateFile) remove(name string) {
	kept := st.LoadBalancers[:0]
	for _, r := range st.LoadBalancers {
		if r.Name != name {
			kept = append(kept, r)
		}
	}
	st.LoadBalancers = kept
}

func portsOf(s *v1.Service) []portRecord {
	ports := []portRecord{}
	for _, p := range s.Spec.Ports {
		protocol := string(p.Protocol)
		if protocol == "" {
			protocol = "TCP"
		}
		ports = append(ports, portRecord{Protocol: protocol, Port: p.Port, NodePort: p.NodePort})
	}
	sort.Slice(ports, func(i, j int) bool {
		if ports[i].Port != ports[j].Port {
			return ports[i].Port < ports[j].Port
		}
		return ports[i].Protocol < ports[j].Protocol
	})
	return ports
}

// ensure creates or updates the Service's load balancer as the Rust fake does: the name is upstream's
// default, the IP the one the Service had (while free), else the first of 203.0.113.0/24 never given to
// another Service, else any free one.
func (st *stateFile) ensure(s *v1.Service, nodes []string) (*lbRecord, error) {
	k := key(s)
	name := cloudprovider.DefaultLoadBalancerName(s)
	for i := range st.LoadBalancers {
		if st.LoadBalancers[i].Name == name {
			r := &st.LoadBalancers[i]
			r.Service, r.Ports, r.Nodes = k, portsOf(s), nodes
			return r, nil
		}
	}
	inUse := map[string]bool{}
	for _, r := range st.LoadBalancers {
		for _, ip := range r.Ingress {
			inUse[ip] = true
		}
	}
	assigned := map[string]bool{}
	for svc, ip := range st.IPAssignments {
		if svc != k {
			assigned[ip] = true
		}
	}
	pool := []string{}
	for i := 1; i < 255; i++ {
		pool = append(pool, net.IPv4(203, 0, 113, byte(i)).String())
	}
	ip := ""
	if prev, ok := st.IPAssignments[k]; ok && !inUse[prev] && strings.HasPrefix(prev, "203.0.113.") {
		ip = prev
	}
	for _, candidate := range pool {
		if ip == "" && !inUse[candidate] && !assigned[candidate] {
			ip = candidate
		}
	}
	for _, candidate := range pool {
		if ip == "" && !inUse[candidate] {
			ip = candidate
		}
	}
	if ip == "" {
		return nil, errors.New("fake cloud: ipPool 203.0.113.0/24 is exhausted")
	}
	if st.IPAssignments == nil {
		st.IPAssignments = map[string]string{}
	}
	st.IPAssignments[k] = ip
	st.LoadBalancers = append(st.LoadBalancers, lbRecord{Name: name, Service: k, Ingress: []string{ip}, Ports: portsOf(s), Nodes: nodes})
	sort.Slice(st.LoadBalancers, func(i, j int) bool { return st.LoadBalancers[i].Name < st.LoadBalancers[j].Name })
	return st.find(k), nil
}

func (s *sharedState) withLock(how int, fn func(lock *os.File) error) error {
	lock, err := os.OpenFile(s.lockPath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("fake cloud: cannot open the state lock file %s: %w", s.lockPath, err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), how); err != nil {
		return fmt.Errorf("fake cloud: cannot lock %s: %w", s.lockPath, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) //nolint:errcheck
	return fn(lock)
}

func (s *sharedState) load() (*stateFile, error) {
	st := &stateFile{other: map[string]json.RawMessage{}}
	text, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fake cloud: cannot read the stateFile %s: %w", s.path, err)
	}
	if err := json.Unmarshal(text, &st.other); err != nil {
		return nil, fmt.Errorf("fake cloud: the stateFile %s is malformed: %w", s.path, err)
	}
	if raw, ok := st.other["loadBalancers"]; ok {
		if err := json.Unmarshal(raw, &st.LoadBalancers); err != nil {
			return nil, fmt.Errorf("fake cloud: the stateFile %s: loadBalancers: %w", s.path, err)
		}
	}
	if raw, ok := st.other["ipAssignments"]; ok {
		if err := json.Unmarshal(raw, &st.IPAssignments); err != nil {
			return nil, fmt.Errorf("fake cloud: the stateFile %s: ipAssignments: %w", s.path, err)
		}
	}
	return st, nil
}

func (s *sharedState) read(fn func(*stateFile)) error {
	return s.withLock(syscall.LOCK_SH, func(*os.File) error {
		st, err := s.load()
		if err != nil {
			return err
		}
		fn(st)
		return nil
	})
}

func (s *sharedState) update(fn func(*stateFile) error) error {
	return s.withLock(syscall.LOCK_EX, func(lock *os.File) error {
		st, err := s.load()
		if err != nil {
			return err
		}
		if err := fn(st); err != nil {
			return err
		}
		revisionText := make([]byte, 32)
		n, _ := lock.ReadAt(revisionText, 0)
		revision, _ := strconv.ParseUint(strings.TrimSpace(string(revisionText[:n])), 10, 64)
		if err := lock.Truncate(0); err != nil {
			return err
		}
		if _, err := lock.WriteAt([]byte(strconv.FormatUint(revision+1, 10)+"\n"), 0); err != nil {
			return err
		}
		if st.LoadBalancers == nil {
			st.LoadBalancers = []lbRecord{}
		}
		set := func(name string, value any) {
			raw, _ := json.Marshal(value)
			st.other[name] = raw
		}
		set("loadBalancers", st.LoadBalancers)
		if len(st.IPAssignments) > 0 {
			set("ipAssignments", st.IPAssignments)
		}
		for name, empty := range map[string]string{"routes": "[]", "calls": "{}"} {
			if _, ok := st.other[name]; !ok {
				st.other[name] = json.RawMessage(empty)
			}
		}
		text, err := json.MarshalIndent(st.other, "", "  ")
		if err != nil {
			return err
		}
		tmp := fmt.Sprintf("%s.tmp-go-%d", s.path, os.Getpid())
		if err := os.WriteFile(tmp, append(text, '\n'), 0o644); err != nil {
			return fmt.Errorf("fake cloud: cannot write %s: %w", tmp, err)
		}
		return os.Rename(tmp, s.path)
	})
}

// Command echo is the test image ccm-rs/echo:test of hack/cluster: a small server that tells a client
// which pod answered and from where the client came, so tests can see how traffic spreads over pods
// and nodes and whether the client's address reached the pod. It is test tooling only; the product is
// Rust.
//
//	HTTP on :8080 (ECHO_HTTP_PORT)
//	  GET /, /hostname   the pod's name and a newline
//	  GET /clientip      the client's address as the pod sees it (host:port) and a newline; behind a
//	                     PROXY protocol v2 header (a load balancer's), the address the header carries,
//	                     followed by " (proxy protocol from <the peer's address>)"
//	  GET /healthz       "ok" (readiness and liveness probes)
//	  anything else      404
//	UDP on :8081 (ECHO_UDP_PORT)
//	  a datagram "hostname" is answered with the pod's name, "clientip" with the sender's address;
//	  any other datagram is sent back as it came
//
// The pod's name is $POD_NAME (set it from the downward API), else the host name (a pod's host name is
// its name). It exits on SIGTERM or SIGINT at once, so a pod stops without waiting for its grace period.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func main() {
	name := os.Getenv("POD_NAME")
	if name == "" {
		host, err := os.Hostname()
		if err != nil {
			log.Fatalf("echo: no POD_NAME and no host name: %v", err)
		}
		name = host
	}
	httpPort := envOr("ECHO_HTTP_PORT", "8080")
	udpPort := envOr("ECHO_UDP_PORT", "8081")

	mux := http.NewServeMux()
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, name) })
	mux.HandleFunc("/hostname", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, name) })
	mux.HandleFunc("/clientip", func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(proxyConnKey{}).(*proxyConn); ok && c.header() != nil {
			fmt.Fprintf(w, "%s (proxy protocol from %s)\n", r.RemoteAddr, c.Conn.RemoteAddr())
			return
		}
		fmt.Fprintln(w, r.RemoteAddr)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	httpListener, err := net.Listen("tcp", ":"+httpPort)
	if err != nil {
		log.Fatalf("echo: HTTP on :%s: %v", httpPort, err)
	}
	udp, err := net.ListenPacket("udp", ":"+udpPort)
	if err != nil {
		log.Fatalf("echo: UDP on :%s: %v", udpPort, err)
	}
	log.Printf("echo: %s serving HTTP on :%s and UDP on :%s", name, httpPort, udpPort)

	server := &http.Server{Handler: mux, ConnContext: withProxyConn}
	go func() { log.Fatal(server.Serve(proxyListener{httpListener})) }()
	go serveUDP(udp, name)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	sig := <-stop
	log.Printf("echo: %s: exiting", sig)
}

func serveUDP(conn net.PacketConn, name string) {
	buf := make([]byte, 65536)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			log.Fatalf("echo: UDP: %v", err)
		}
		reply := buf[:n]
		switch string(reply) {
		case "hostname", "hostname\n":
			reply = []byte(name + "\n")
		case "clientip", "clientip\n":
			reply = []byte(from.String() + "\n")
		}
		if _, err := conn.WriteTo(reply, from); err != nil {
			log.Printf("echo: UDP reply to %s: %v", from, err)
		}
	}
}

func envOr(key, fallback string) string {
	if value := os.Getenv(key); value != "" {
		return value
	}
	return fallback
}

// proxyListener accepts connections that may start with a PROXY protocol v2 header: such a connection's
// RemoteAddr is the source address the header carries, and the real peer is kept for /clientip. The
// header is looked for in the connection's own goroutine (its first RemoteAddr or Read), never in
// Accept: the server accepts one connection at a time, and a client that connects and sends nothing
// (its node died with the request in flight) would hold every other connection back for the 5 s the
// look may wait, until the listen queue overflows.
type proxyListener struct{ net.Listener }

type proxyConn struct {
	net.Conn
	reader *bufio.Reader
	looked sync.Once
	source net.Addr // from the header, or nil
}

type proxyConnKey struct{}

var proxySignature = []byte("\r\n\r\n\x00\r\nQUIT\n")

func (l proxyListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &proxyConn{Conn: conn, reader: bufio.NewReader(conn)}, nil
}

// header reads the PROXY header if the connection starts with one (once), and returns its source
// address (nil without one).
func (c *proxyConn) header() net.Addr {
	c.looked.Do(func() {
		_ = c.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if head, err := c.reader.Peek(len(proxySignature)); err == nil && bytes.Equal(head, proxySignature) {
			source, err := readProxyHeader(c.reader)
			if err != nil {
				log.Printf("echo: bad PROXY header from %s: %v", c.Conn.RemoteAddr(), err)
				c.Conn.Close() // the server sees a closed connection and moves on
				return
			}
			c.source = source
		}
		_ = c.Conn.SetReadDeadline(time.Time{})
	})
	return c.source
}

func (c *proxyConn) Read(p []byte) (int, error) {
	c.header()
	return c.reader.Read(p)
}

func (c *proxyConn) RemoteAddr() net.Addr {
	if source := c.header(); source != nil {
		return source
	}
	return c.Conn.RemoteAddr()
}

func withProxyConn(ctx context.Context, conn net.Conn) context.Context {
	if c, ok := conn.(*proxyConn); ok {
		return context.WithValue(ctx, proxyConnKey{}, c)
	}
	return ctx
}

// readProxyHeader reads a PROXY protocol v2 header (signature, version/command, family, length,
// addresses) and returns the source address of a PROXY command over TCP, or nil for LOCAL.
func readProxyHeader(r *bufio.Reader) (net.Addr, error) {
	fixed := make([]byte, 16)
	if _, err := io.ReadFull(r, fixed); err != nil {
		return nil, err
	}
	if fixed[12]>>4 != 2 {
		return nil, fmt.Errorf("version %d, not 2", fixed[12]>>4)
	}
	body := make([]byte, binary.BigEndian.Uint16(fixed[14:16]))
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	if fixed[12]&0x0f == 0 { // LOCAL: the proxy's own connection (a health check)
		return nil, nil
	}
	switch fixed[13] {
	case 0x11: // TCP over IPv4: source, destination, source port, destination port
		if len(body) < 12 {
			return nil, fmt.Errorf("short IPv4 addresses")
		}
		return &net.TCPAddr{IP: net.IP(body[0:4]), Port: int(binary.BigEndian.Uint16(body[8:10]))}, nil
	case 0x21: // TCP over IPv6
		if len(body) < 36 {
			return nil, fmt.Errorf("short IPv6 addresses")
		}
		return &net.TCPAddr{IP: net.IP(body[0:16]), Port: int(binary.BigEndian.Uint16(body[32:34]))}, nil
	default:
		return nil, fmt.Errorf("family/protocol 0x%02x not supported", fixed[13])
	}
}

// Command protobuf-body turns Kubernetes objects written as JSON into the protobuf bodies client-go sends
// (Content-Type application/vnd.kubernetes.protobuf), so bench/write-costs/measure.py can measure what a
// protobuf request body costs the API server against a JSON one (issue #31). Python has no Kubernetes
// protobuf types; this is the serializer the API server and client-go use.
//
// Input: one JSON object per line on stdin (core/v1 kinds: Node, Event, ...). Output: one line per input
// line, the protobuf body in standard base64. A line that does not decode is an error naming its number.
package main

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
)

func main() {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		fail("registering core/v1: %v", err)
	}
	decoder := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	encoder := protobuf.NewSerializer(scheme, scheme)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for line := 1; in.Scan(); line++ {
		object, _, err := decoder.Decode(in.Bytes(), nil, nil)
		if err != nil {
			fail("line %d: not a core/v1 object in JSON: %v", line, err)
		}
		body, err := runtime.Encode(encoder, object)
		if err != nil {
			fail("line %d: encoding %T as protobuf: %v", line, object, err)
		}
		fmt.Fprintln(out, base64.StdEncoding.EncodeToString(body))
	}
	if err := in.Err(); err != nil {
		fail("reading stdin: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "protobuf-body: "+format+"\n", args...)
	os.Exit(1)
}

package main

// The misbehaving variants: what a broken or hostile Function package does
// to the runtime that hosts it.
//
//	never-listen         prints to stderr, then sleeps forever without listening
//	exit-on-second-call  answers the first call, exits 3 (after a stderr line) on the second
//	memory-hog           on a call, allocates and touches memory until it is killed
//	network-probe        on a call, tries the network and reports what worked

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
)

// neverListen never returns.
func neverListen() {
	fmt.Fprintln(os.Stderr, "crossplanefn: never-listen: sleeping forever without listening")
	for {
		time.Sleep(time.Hour)
	}
}

// hogChunk is how much memory hogMemory takes at a time.
const hogChunk = 16 << 20

// hogMemory allocates memory and writes to every page of it, so that it is
// really used, until the process is killed. It gives up after maxMiB, so a
// limit that is not enforced shows as a failed call instead of a host out of
// memory.
func hogMemory(maxMiB int) error {
	var hoard [][]byte
	for len(hoard)*hogChunk < maxMiB<<20 {
		b := make([]byte, hogChunk)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		hoard = append(hoard, b)
		if mib := len(hoard) * hogChunk >> 20; mib%64 == 0 {
			fmt.Fprintf(os.Stderr, "crossplanefn: memory-hog: %d MiB in use\n", mib)
		}
	}
	return status.Errorf(codes.ResourceExhausted,
		"memory-hog: allocated %d MiB and was not killed", len(hoard)*hogChunk>>20)
}

// probeResult is what one network probe found.
type probeResult struct {
	target string
	ok     bool
	detail string
}

// probeContextKey is the context key under which the network probe puts its
// findings: {target: {"ok": bool, "detail": text}}.
const probeContextKey = "fnrun.dev/network-probe"

// probe tries every network target at once and answers with one Normal
// result that lists them, and the same in the response's context. It never
// fails the call.
func (f *function) probe(ctx context.Context, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	var probes []func() probeResult
	for _, addr := range strings.Split(f.o.probeExternal, ",") {
		addr := strings.TrimSpace(addr)
		if addr == "" {
			continue
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "--probe-external %q: %v", addr, err)
		}
		probes = append(probes,
			func() probeResult { return probeTCP(ctx, addr, f.o.probeTimeout) },
			func() probeResult { return probeDNS(net.JoinHostPort(host, "53"), f.o.probeTimeout) },
		)
	}
	if f.o.probeLoopbackPort != 0 {
		addr := fmt.Sprintf("127.0.0.1:%d", f.o.probeLoopbackPort)
		probes = append(probes, func() probeResult { return probePing(addr, f.o.probeTimeout) })
	}
	results := make([]probeResult, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		go func(i int, p func() probeResult) {
			defer wg.Done()
			results[i] = p()
		}(i, p)
	}
	wg.Wait()
	sort.SliceStable(results, func(i, j int) bool { return results[i].target < results[j].target })

	rsp := to(req)
	found := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	var parts []string
	for _, r := range results {
		verdict := "failed"
		if r.ok {
			verdict = "ok"
		}
		parts = append(parts, fmt.Sprintf("%s %s (%s)", r.target, verdict, r.detail))
		found.Fields[r.target] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"ok":     structpb.NewBoolValue(r.ok),
			"detail": structpb.NewStringValue(r.detail),
		}})
	}
	if rsp.Context == nil {
		rsp.Context = &structpb.Struct{}
	}
	if rsp.Context.Fields == nil {
		rsp.Context.Fields = map[string]*structpb.Value{}
	}
	rsp.Context.Fields[probeContextKey] = structpb.NewStructValue(found)
	rsp.Results = append(rsp.Results, &fnv1.Result{
		Severity: fnv1.Severity_SEVERITY_NORMAL,
		Message:  fmt.Sprintf("%s network-probe: %s", f.o.name, strings.Join(parts, "; ")),
	})
	return rsp, nil
}

// probeTCP connects to addr.
func probeTCP(ctx context.Context, addr string, timeout time.Duration) probeResult {
	r := probeResult{target: "tcp " + addr}
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		r.detail = err.Error()
		return r
	}
	conn.Close()
	r.ok, r.detail = true, "connected"
	return r
}

// probeDNS sends a DNS query for example.org over UDP to addr and waits for
// an answer: a UDP "connection" alone proves nothing.
func probeDNS(addr string, timeout time.Duration) probeResult {
	r := probeResult{target: "udp " + addr}
	conn, err := net.DialTimeout("udp", addr, timeout)
	if err != nil {
		r.detail = err.Error()
		return r
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	// ID 0x6e72, recursion desired, one question: example.org IN A.
	query := []byte{0x6e, 0x72, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0,
		7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'o', 'r', 'g', 0, 0, 1, 0, 1}
	if _, err := conn.Write(query); err != nil {
		r.detail = err.Error()
		return r
	}
	answer := make([]byte, 512)
	n, err := conn.Read(answer)
	if err != nil {
		r.detail = err.Error()
		return r
	}
	if n < 2 || answer[0] != query[0] || answer[1] != query[1] {
		r.detail = fmt.Sprintf("%d bytes that are not an answer to the query", n)
		return r
	}
	r.ok, r.detail = true, fmt.Sprintf("answered with %d bytes", n)
	return r
}

// probePing sends "ping" to addr and reads one line back (see the tests'
// PongServer).
func probePing(addr string, timeout time.Duration) probeResult {
	r := probeResult{target: "tcp " + addr}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		r.detail = err.Error()
		return r
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		r.detail = err.Error()
		return r
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		r.ok, r.detail = true, "connected; no reply: "+err.Error()
		return r
	}
	r.ok, r.detail = true, "reply "+strings.TrimSpace(line)
	return r
}

// Command runfunction calls fnrun's RunFunction with grpc-go, the gRPC library
// of Crossplane's composition controller, and prints the outcome as one JSON
// object: {"code": "OK" or a status code name, "message": ..., "output": ...}.
//
// With -calls N it is a load client instead (bench/run.sh's grpc-go step): N
// calls of the same request, -concurrency at a time on one connection, after
// -warmup calls not counted, and it prints one JSON object with the calls
// that failed and the latencies' percentiles (ms) and the rate (runs/s).
//
// How it dials decides the :authority grpc-go sends:
//
//	-target unix:/path/fn.sock                      grpc-go's own unix support ("localhost")
//	-target /path/fn.sock -dial unix                a dialer of its own (the path)
//	-target unix-abstract:NAME -dial unix-abstract  a dialer of its own (the whole target)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	pb "fnrun.test/gen/v1alpha1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

type result struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Output  string `json:"output"`
}

func main() {
	target := flag.String("target", "", "gRPC target")
	dial := flag.String("dial", "", "dial with a dialer of its own: unix or unix-abstract")
	image := flag.String("image", "", "the function's image")
	input := flag.String("input", "-", "the FunctionIO input file, - for stdin")
	timeout := flag.Duration("timeout", 120*time.Second, "how long the call may take")
	calls := flag.Int("calls", 0, "a load of this many calls instead of one call")
	concurrency := flag.Int("concurrency", 1, "calls in flight at once, with -calls")
	warmup := flag.Int("warmup", 0, "calls made before the load and not counted, with -calls")
	flag.Parse()

	var in []byte
	var err error
	if *input == "-" {
		in, err = io.ReadAll(os.Stdin)
	} else {
		in, err = os.ReadFile(*input)
	}
	if err != nil {
		fail(err)
	}

	opts := []grpc.DialOption{
		grpc.WithInsecure(),
		grpc.WithBlock(),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64 << 20)),
	}
	switch *dial {
	case "":
	case "unix":
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}))
	case "unix-abstract":
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", abstractAddress(addr))
		}))
	default:
		fail(fmt.Errorf("-dial %q: want unix or unix-abstract", *dial))
	}

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := grpc.DialContext(ctx, *target, opts...)
	if err != nil {
		fail(err)
	}
	defer conn.Close()

	client := pb.NewContainerizedFunctionRunnerServiceClient(conn)
	req := &pb.RunFunctionRequest{Image: *image, Input: in}
	if *calls > 0 {
		if *concurrency < 1 || *warmup < 0 {
			fail(fmt.Errorf("-concurrency must be at least 1 and -warmup not negative"))
		}
		summary := runLoad(ctx, client, req, *calls, *concurrency, *warmup)
		if err := json.NewEncoder(os.Stdout).Encode(summary); err != nil {
			fail(err)
		}
		return
	}
	rsp, err := client.RunFunction(ctx, req)
	r := result{Code: "OK"}
	if err != nil {
		s := status.Convert(err)
		r = result{Code: s.Code().String(), Message: s.Message()}
	} else {
		r.Output = string(rsp.GetOutput())
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "runfunction:", err)
	os.Exit(2)
}

// abstractAddress is the abstract socket address for what grpc-go gives a
// dialer of its own for a unix-abstract:NAME target: the target itself
// (grpc-go before 1.34), or "unix:@NAME" now that grpc-go resolves that
// scheme itself.
func abstractAddress(addr string) string {
	for _, prefix := range []string{"unix-abstract:", "unix:", "@"} {
		addr = strings.TrimPrefix(addr, prefix)
	}
	return "@" + addr
}

type loadSummary struct {
	Calls       int     `json:"calls"`
	Concurrency int     `json:"concurrency"`
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	RunsPerS    float64 `json:"runs_per_s"`
}

// runLoad makes warmup calls one at a time, then calls calls with
// concurrency workers sharing the one connection, as Crossplane's composition
// controller shares its ClientConn, each call timed on its own.
func runLoad(ctx context.Context, client pb.ContainerizedFunctionRunnerServiceClient, req *pb.RunFunctionRequest, calls, concurrency, warmup int) loadSummary {
	for i := 0; i < warmup; i++ {
		_, _ = client.RunFunction(ctx, req)
	}
	var (
		mu        sync.Mutex
		latencies = make([]time.Duration, 0, calls)
		errors    int
		first     string
		next      = make(chan struct{}, calls)
		wg        sync.WaitGroup
	)
	for i := 0; i < calls; i++ {
		next <- struct{}{}
	}
	close(next)
	start := time.Now()
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				t := time.Now()
				_, err := client.RunFunction(ctx, req)
				took := time.Since(t)
				mu.Lock()
				if err != nil {
					if errors == 0 {
						first = err.Error()
					}
					errors++
				} else {
					latencies = append(latencies, took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	return loadSummary{
		Calls:       calls,
		Concurrency: concurrency,
		Errors:      errors,
		FirstError:  first,
		P50Ms:       percentileMs(latencies, 0.50),
		P99Ms:       percentileMs(latencies, 0.99),
		RunsPerS:    float64(len(latencies)) / wall.Seconds(),
	}
}

// percentileMs is the nearest-rank percentile p of sorted, in milliseconds
// (as the Rust load client computes it); 0 for none.
func percentileMs(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return float64(sorted[rank-1].Microseconds()) / 1000
}

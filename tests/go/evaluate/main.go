// Command evaluate calls Porch's evaluator.FunctionEvaluator/EvaluateFunction
// with grpc-go, as Porch's engine does, once per -image, all calls at once,
// and prints one JSON array: per call {"image", "code" (OK or a status code
// name), "message", "resource_list", "log", "started_ms", "finished_ms"},
// the times in milliseconds since the first call started.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	pb "fnrun.test/evaluator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

type result struct {
	Image        string `json:"image"`
	Code         string `json:"code"`
	Message      string `json:"message"`
	ResourceList string `json:"resource_list"`
	Log          string `json:"log"`
	StartedMs    int64  `json:"started_ms"`
	FinishedMs   int64  `json:"finished_ms"`
}

type images []string

func (i *images) String() string     { return strings.Join(*i, ",") }
func (i *images) Set(s string) error { *i = append(*i, s); return nil }

func main() {
	target := flag.String("target", "", "gRPC target: unix:PATH or HOST:PORT")
	abstract := flag.Bool("abstract", false, "the target is unix-abstract:NAME, dialed by a dialer of its own")
	input := flag.String("input", "-", "the input ResourceList file, - for stdin")
	tag := flag.String("tag", "", "the request's Tag")
	timeout := flag.Duration("timeout", 120*time.Second, "how long the calls may take")
	var imgs images
	flag.Var(&imgs, "image", "a function image (repeatable: the calls run at once)")
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
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20), grpc.MaxCallRecvMsgSize(64<<20)),
	}
	if *abstract {
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", abstractAddress(addr))
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	conn, err := grpc.DialContext(ctx, *target, opts...)
	if err != nil {
		fail(err)
	}
	defer conn.Close()
	client := pb.NewFunctionEvaluatorClient(conn)

	results := make([]result, len(imgs))
	start := time.Now()
	var wg sync.WaitGroup
	for i, image := range imgs {
		wg.Add(1)
		go func(i int, image string) {
			defer wg.Done()
			r := result{Image: image, Code: "OK", StartedMs: time.Since(start).Milliseconds()}
			rsp, err := client.EvaluateFunction(ctx, &pb.EvaluateFunctionRequest{
				ResourceList: in,
				Image:        image,
				Tag:          *tag,
			})
			r.FinishedMs = time.Since(start).Milliseconds()
			if err != nil {
				s := status.Convert(err)
				r.Code, r.Message = s.Code().String(), s.Message()
			} else {
				r.ResourceList, r.Log = string(rsp.GetResourceList()), string(rsp.GetLog())
			}
			results[i] = r
		}(i, image)
	}
	wg.Wait()
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "evaluate:", err)
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

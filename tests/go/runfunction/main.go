// Command runfunction calls fnrun's RunFunction with grpc-go, the gRPC library
// of Crossplane's composition controller, and prints the outcome as one JSON
// object: {"code": "OK" or a status code name, "message": ..., "output": ...}.
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
	"net"
	"os"
	"strings"
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

	rsp, err := pb.NewContainerizedFunctionRunnerServiceClient(conn).RunFunction(ctx, &pb.RunFunctionRequest{
		Image: *image,
		Input: in,
	})
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

// Command crossplanefn is a Crossplane composition function for fnrun's
// tests: a gRPC server of apiextensions.fn.proto.v1 (and v1beta1) built on
// grpc-go, started as Crossplane's function runtime starts a Function
// package, with the flags of function-sdk-go's template:
//
//	--insecure                  plain h2c
//	--tls-certs-dir DIR         mTLS: DIR/tls.crt, DIR/tls.key, and DIR/ca.crt to verify
//	                            clients (default $TLS_SERVER_CERTS_DIR)
//	--address ADDR              where to listen (default :9443)
//
// The normal function (--variant=label) copies the desired state, adds a label
// to every desired composed resource, adds one Normal result, echoes the
// request's tag and passes the context through. It also serves
// grpc.health.v1 and server reflection. The other variants misbehave as a
// hostile or broken function would (see variants.go).
//
// It prints "crossplanefn: listening on HOST:PORT" to stderr once it accepts
// connections, so a caller may listen on port 0.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	fnv1beta1 "github.com/crossplane/function-sdk-go/proto/v1beta1"
)

// options are the command line.
type options struct {
	address     string
	insecure    bool
	tlsCertsDir string
	variant     string
	serve       string
	name        string
	labelKey    string
	labelValue  string
	delay       time.Duration

	probeLoopbackPort int
	probeExternal     string
	probeTimeout      time.Duration
	hogMax            int
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "crossplanefn:", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "crossplanefn:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("crossplanefn", flag.ContinueOnError)
	fs.StringVar(&o.address, "address", ":9443", "address at which to listen for gRPC connections")
	fs.BoolVar(&o.insecure, "insecure", false, "serve plain h2c, without mTLS; wins over --tls-certs-dir")
	fs.StringVar(&o.tlsCertsDir, "tls-certs-dir", os.Getenv("TLS_SERVER_CERTS_DIR"),
		"directory with tls.crt, tls.key and the ca.crt that verifies clients")
	fs.StringVar(&o.variant, "variant", "label",
		"label | never-listen | exit-on-second-call | memory-hog | network-probe")
	fs.StringVar(&o.serve, "serve", "v1,v1beta1", "the RunFunction services to register: v1, v1beta1 or both")
	fs.StringVar(&o.name, "name", "function-label", "the function's name, in its result messages")
	label := fs.String("label", "fnrun.dev/touched=true", "the label KEY=VALUE set on every desired composed resource")
	fs.DurationVar(&o.delay, "delay", 0, "how long each call waits before it answers")
	fs.IntVar(&o.probeLoopbackPort, "probe-loopback-port", 0,
		"network-probe: also ping this port on 127.0.0.1 (0: do not)")
	fs.StringVar(&o.probeExternal, "probe-external", "203.0.113.1:443,1.1.1.1:53",
		"network-probe: TCP addresses to dial, comma separated; a DNS query over UDP goes to each one on port 53")
	fs.DurationVar(&o.probeTimeout, "probe-timeout", 2*time.Second, "network-probe: how long each probe may take")
	fs.IntVar(&o.hogMax, "hog-max-mib", 4096,
		"memory-hog: give up (and fail the call) after allocating this many MiB without being killed")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	k, v, ok := strings.Cut(*label, "=")
	if !ok || k == "" {
		return nil, fmt.Errorf("--label %q: want KEY=VALUE", *label)
	}
	o.labelKey, o.labelValue = k, v
	switch o.variant {
	case "label", "never-listen", "exit-on-second-call", "memory-hog", "network-probe":
	default:
		return nil, fmt.Errorf("--variant %q: unknown", o.variant)
	}
	if _, _, err := services(o.serve); err != nil {
		return nil, err
	}
	return o, nil
}

// services reads --serve.
func services(serve string) (v1, v1beta1 bool, err error) {
	for _, s := range strings.Split(serve, ",") {
		switch strings.TrimSpace(s) {
		case "v1":
			v1 = true
		case "v1beta1":
			v1beta1 = true
		default:
			return false, false, fmt.Errorf("--serve %q: want v1, v1beta1 or v1,v1beta1", serve)
		}
	}
	return v1, v1beta1, nil
}

func run(o *options) error {
	if o.variant == "never-listen" {
		neverListen()
	}
	creds, err := credentialsFor(o)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", o.address)
	if err != nil {
		return fmt.Errorf("cannot listen on %q: %w", o.address, err)
	}
	var opts []grpc.ServerOption
	mode := "insecure"
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
		mode = "mTLS"
	}
	srv := grpc.NewServer(opts...)
	fn := &function{o: o}
	v1, v1beta1, _ := services(o.serve)
	hs := health.NewServer()
	if v1 {
		fnv1.RegisterFunctionRunnerServiceServer(srv, &v1Server{fn: fn})
		hs.SetServingStatus("apiextensions.fn.proto.v1.FunctionRunnerService", healthpb.HealthCheckResponse_SERVING)
	}
	if v1beta1 {
		fnv1beta1.RegisterFunctionRunnerServiceServer(srv, &v1beta1Server{fn: fn})
		hs.SetServingStatus("apiextensions.fn.proto.v1beta1.FunctionRunnerService", healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	fmt.Fprintf(os.Stderr, "crossplanefn: %s (%s, serving %s, %s) listening on %s\n",
		o.name, o.variant, o.serve, mode, lis.Addr())
	return srv.Serve(lis)
}

// credentialsFor gives the server's transport credentials, nil for h2c, as
// function-sdk-go does: --insecure wins, else mTLS from --tls-certs-dir with
// client certificates required and verified against its ca.crt.
func credentialsFor(o *options) (credentials.TransportCredentials, error) {
	if o.insecure {
		return nil, nil
	}
	if o.tlsCertsDir == "" {
		return nil, errors.New("no credentials: pass --insecure or --tls-certs-dir (or set TLS_SERVER_CERTS_DIR)")
	}
	crt, err := tls.LoadX509KeyPair(
		filepath.Join(o.tlsCertsDir, "tls.crt"),
		filepath.Join(o.tlsCertsDir, "tls.key"),
	)
	if err != nil {
		return nil, fmt.Errorf("cannot load the X509 key pair: %w", err)
	}
	ca, err := os.ReadFile(filepath.Join(o.tlsCertsDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("cannot read the CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("invalid CA certificate")
	}
	return credentials.NewTLS(&tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{crt},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}), nil
}

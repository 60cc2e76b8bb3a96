// Command crossplaneclient calls a Crossplane composition function the way
// Crossplane's function runner does, with the grpc-go that Crossplane v2
// ships (grpc.NewClient, function-sdk-go's stubs): over mTLS (a client
// certificate, the server's verified against a CA, ALPN h2 required as
// grpc-go 1.67 and later require it, SNI and :authority of the function's
// service) or plain h2c; apiextensions.fn.proto.v1 RunFunction first, and
// v1beta1 when the server answers UNIMPLEMENTED.
//
//	crossplaneclient -address HOST:PORT [-insecure | -ca CA -cert CRT -key KEY]
//	    [-server-name SNI] [-authority AUTHORITY] [-api auto|v1|v1beta1]
//	    [-request FILE|-] [-timeout 30s] [-calls N -concurrency C]
//
// The request is a v1 RunFunctionRequest in protojson, as JSON or YAML.
//
// One call prints one JSON object: {"version": the API that answered,
// "fallback": whether v1 answered UNIMPLEMENTED first, "code": "OK" or the
// status code's name, "code_number", "message", "response": the
// RunFunctionResponse as protojson, "tls": the connection's TLS state,
// "elapsed_ms"}. With -calls N it makes N calls (C at once) on one
// connection and prints a summary with latency percentiles instead.
//
// It exits 0 whenever it could make the call, whatever the status; 2 when it
// could not (bad flags, unreadable files).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	fnv1beta1 "github.com/crossplane/function-sdk-go/proto/v1beta1"
)

// maxMessage is the largest message either side may send: Crossplane's
// runner raises grpc-go's 4 MiB default the same way.
const maxMessage = 100 << 20

type options struct {
	address     string
	insecure    bool
	ca          string
	cert        string
	key         string
	serverName  string
	authority   string
	api         string
	request     string
	timeout     time.Duration
	calls       int
	concurrency int
}

func main() {
	o := &options{}
	flag.StringVar(&o.address, "address", "", "the function's gRPC target, e.g. 127.0.0.1:9443")
	flag.BoolVar(&o.insecure, "insecure", false, "plain h2c instead of mTLS")
	flag.StringVar(&o.ca, "ca", "", "PEM CA certificate the server's certificate must chain to")
	flag.StringVar(&o.cert, "cert", "", "PEM client certificate (mTLS); none if empty")
	flag.StringVar(&o.key, "key", "", "PEM key of -cert")
	flag.StringVar(&o.serverName, "server-name", "", "TLS server name (SNI) to send and verify; default the target's host")
	flag.StringVar(&o.authority, "authority", "", "the :authority to send; default the target")
	flag.StringVar(&o.api, "api", "auto", "auto (v1, then v1beta1 on UNIMPLEMENTED), v1 or v1beta1")
	flag.StringVar(&o.request, "request", "-", "RunFunctionRequest as protojson JSON or YAML; - for stdin")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Second, "deadline of each call")
	flag.IntVar(&o.calls, "calls", 1, "how many calls to make; more than one prints a latency summary")
	flag.IntVar(&o.concurrency, "concurrency", 1, "calls in flight at once with -calls")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "crossplaneclient:", err)
		os.Exit(2)
	}
}

func run(o *options) error {
	if o.address == "" {
		return errors.New("-address is required")
	}
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", flag.Args())
	}
	switch o.api {
	case "auto", "v1", "v1beta1":
	default:
		return fmt.Errorf("-api %q: want auto, v1 or v1beta1", o.api)
	}
	if o.calls < 1 || o.concurrency < 1 {
		return errors.New("-calls and -concurrency must be at least 1")
	}
	req, err := readRequest(o.request)
	if err != nil {
		return err
	}
	opts, err := dialOptions(o)
	if err != nil {
		return err
	}
	// As Crossplane's function runner connects (internal/xfn).
	conn, err := grpc.NewClient(o.address, opts...)
	if err != nil {
		return fmt.Errorf("cannot create a client for %s: %w", o.address, err)
	}
	defer conn.Close()
	c := &caller{conn: conn, api: o.api, timeout: o.timeout, opts: callOptions(o)}
	var out interface{}
	if o.calls == 1 {
		out = c.once(req)
	} else {
		out = c.bench(req, o.calls, o.concurrency)
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// splitAuthority says whether the TLS server name and the :authority name
// different hosts, which grpc-go lets a client send only per call.
func (o *options) splitAuthority() bool {
	if o.insecure || o.serverName == "" || o.authority == "" {
		return false
	}
	host := o.authority
	if h, _, err := net.SplitHostPort(o.authority); err == nil {
		host = h
	}
	return host != o.serverName
}

// unvalidatedCreds are TLS credentials whose connections let a call carry an
// :authority that the server's certificate does not name: grpc-go refuses
// that since 1.7x (Crossplane never sends one), but other clients can, and
// the tests check that a TLS connection is routed by its SNI alone.
type unvalidatedCreds struct {
	credentials.TransportCredentials
}

func (c unvalidatedCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if ti, ok := info.(credentials.TLSInfo); ok {
		return conn, unvalidatedInfo{ti}, err
	}
	return conn, info, err
}

func (c unvalidatedCreds) Clone() credentials.TransportCredentials {
	return unvalidatedCreds{c.TransportCredentials.Clone()}
}

// unvalidatedInfo is a connection's TLSInfo that accepts any authority.
type unvalidatedInfo struct {
	info credentials.TLSInfo
}

func (u unvalidatedInfo) AuthType() string { return u.info.AuthType() }

// ValidateAuthority accepts every :authority (grpc-go's AuthorityValidator).
func (u unvalidatedInfo) ValidateAuthority(string) error { return nil }

// callOptions are the options of every call.
func callOptions(o *options) []grpc.CallOption {
	if o.splitAuthority() {
		return []grpc.CallOption{grpc.CallAuthority(o.authority)}
	}
	return nil
}

func dialOptions(o *options) ([]grpc.DialOption, error) {
	opts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
	}
	// grpc-go refuses a dial-time authority that differs from the TLS
	// server name (as since 1.5x): with both, and another host in each, the
	// authority goes with each call instead (see callOptions).
	if o.authority != "" && !o.splitAuthority() {
		opts = append(opts, grpc.WithAuthority(o.authority))
	}
	if o.insecure {
		return append(opts, grpc.WithTransportCredentials(insecure.NewCredentials())), nil
	}
	if o.ca == "" {
		return nil, errors.New("-ca is required without -insecure")
	}
	pem, err := os.ReadFile(o.ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", o.ca)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	if o.authority == "" || o.splitAuthority() {
		// Else grpc-go sends the authority's host as SNI.
		cfg.ServerName = o.serverName
	}
	if o.cert != "" || o.key != "" {
		crt, err := tls.LoadX509KeyPair(o.cert, o.key)
		if err != nil {
			return nil, fmt.Errorf("cannot load the client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{crt}
	}
	creds := credentials.NewTLS(cfg)
	if o.splitAuthority() {
		creds = unvalidatedCreds{creds}
	}
	return append(opts, grpc.WithTransportCredentials(creds)), nil
}

// caller makes calls on one connection.
type caller struct {
	conn    *grpc.ClientConn
	api     string
	timeout time.Duration
	opts    []grpc.CallOption
}

// outcome is one call, as printed.
type outcome struct {
	Version    string          `json:"version"`
	Fallback   bool            `json:"fallback"`
	Code       string          `json:"code"`
	CodeNumber uint32          `json:"code_number"`
	Message    string          `json:"message"`
	Response   json.RawMessage `json:"response,omitempty"`
	TLS        *tlsState       `json:"tls,omitempty"`
	ElapsedMS  float64         `json:"elapsed_ms"`
}

// tlsState is what the client saw of the server's TLS.
type tlsState struct {
	Version    string   `json:"version"`
	ALPN       string   `json:"alpn"`
	ServerName string   `json:"server_name"`
	PeerDNS    []string `json:"peer_dns_names"`
	PeerCN     string   `json:"peer_common_name"`
}

// once makes one call and describes it.
func (c *caller) once(req *fnv1.RunFunctionRequest) *outcome {
	start := time.Now()
	var p peer.Peer
	rsp, version, fallback, err := c.call(req, grpc.Peer(&p))
	o := &outcome{Version: version, Fallback: fallback, ElapsedMS: ms(time.Since(start))}
	s := status.Convert(err)
	o.Code, o.CodeNumber, o.Message = s.Code().String(), uint32(s.Code()), s.Message()
	if err == nil {
		b, merr := protojson.Marshal(rsp)
		if merr != nil {
			o.Code, o.CodeNumber = codes.Internal.String(), uint32(codes.Internal)
			o.Message = "cannot print the response: " + merr.Error()
		} else {
			o.Response = b
		}
	}
	if u, ok := p.AuthInfo.(unvalidatedInfo); ok {
		p.AuthInfo = u.info
	}
	if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
		o.TLS = describeTLS(ti.State)
	}
	return o
}

// call is one RunFunction as Crossplane makes it: v1 first and, when that is
// UNIMPLEMENTED, the same request again as v1beta1.
func (c *caller) call(req *fnv1.RunFunctionRequest, opts ...grpc.CallOption) (rsp *fnv1.RunFunctionResponse, version string, fallback bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	opts = append(append([]grpc.CallOption{}, c.opts...), opts...)
	if c.api != "v1beta1" {
		rsp, err = fnv1.NewFunctionRunnerServiceClient(c.conn).RunFunction(ctx, req, opts...)
		if c.api == "v1" || status.Code(err) != codes.Unimplemented {
			return rsp, "v1", false, err
		}
		fallback = true
	}
	breq := &fnv1beta1.RunFunctionRequest{}
	if err := transcode(req, breq); err != nil {
		return nil, "v1beta1", fallback, status.Errorf(codes.Internal, "cannot make the v1beta1 request: %v", err)
	}
	brsp, err := fnv1beta1.NewFunctionRunnerServiceClient(c.conn).RunFunction(ctx, breq, opts...)
	if err != nil {
		return nil, "v1beta1", fallback, err
	}
	rsp = &fnv1.RunFunctionResponse{}
	if err := transcode(brsp, rsp); err != nil {
		return nil, "v1beta1", fallback, status.Errorf(codes.Internal, "cannot read the v1beta1 response: %v", err)
	}
	return rsp, "v1beta1", fallback, nil
}

func transcode(from, to proto.Message) error {
	b, err := proto.Marshal(from)
	if err != nil {
		return err
	}
	return proto.Unmarshal(b, to)
}

func describeTLS(s tls.ConnectionState) *tlsState {
	t := &tlsState{Version: tlsVersion(s.Version), ALPN: s.NegotiatedProtocol, ServerName: s.ServerName}
	if len(s.PeerCertificates) > 0 {
		leaf := s.PeerCertificates[0]
		t.PeerDNS, t.PeerCN = leaf.DNSNames, leaf.Subject.CommonName
	}
	return t
}

func tlsVersion(v uint16) string {
	switch v {
	case tls.VersionTLS12:
		return "TLS 1.2"
	case tls.VersionTLS13:
		return "TLS 1.3"
	}
	return fmt.Sprintf("0x%04X", v)
}

func ms(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}

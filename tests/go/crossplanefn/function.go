package main

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	fnv1beta1 "github.com/crossplane/function-sdk-go/proto/v1beta1"
)

// responseTTL is the ttl of every response, function-sdk-go's default
// (response.DefaultTTL). Its response package is not used: it pulls in
// Kubernetes' apimachinery, which makes this binary three times larger and
// slower to start in every sandbox of the tests.
const responseTTL = time.Minute

// function answers RunFunction for both API versions: v1beta1 messages are
// read as v1 ones (the wire format is the same).
type function struct {
	o     *options
	calls int64
}

type v1Server struct {
	fnv1.UnimplementedFunctionRunnerServiceServer
	fn *function
}

func (s *v1Server) RunFunction(ctx context.Context, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	return s.fn.run(ctx, "v1", req)
}

type v1beta1Server struct {
	fnv1beta1.UnimplementedFunctionRunnerServiceServer
	fn *function
}

func (s *v1beta1Server) RunFunction(ctx context.Context, req *fnv1beta1.RunFunctionRequest) (*fnv1beta1.RunFunctionResponse, error) {
	r := &fnv1.RunFunctionRequest{}
	if err := transcode(req, r); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "cannot read the v1beta1 request: %v", err)
	}
	rsp, err := s.fn.run(ctx, "v1beta1", r)
	if err != nil {
		return nil, err
	}
	out := &fnv1beta1.RunFunctionResponse{}
	if err := transcode(rsp, out); err != nil {
		return nil, status.Errorf(codes.Internal, "cannot write the v1beta1 response: %v", err)
	}
	return out, nil
}

// transcode reads one message as another with the same wire format.
func transcode(from, to proto.Message) error {
	b, err := proto.Marshal(from)
	if err != nil {
		return err
	}
	return proto.Unmarshal(b, to)
}

// run is one call: the variant's misbehaviour, if it has one for calls, then
// the label function.
func (f *function) run(ctx context.Context, version string, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	n := atomic.AddInt64(&f.calls, 1)
	if f.o.delay > 0 {
		select {
		case <-time.After(f.o.delay):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if err := failWith(req); err != nil {
		return nil, err
	}
	switch f.o.variant {
	case "exit-on-second-call":
		if n == 2 {
			fmt.Fprintf(os.Stderr, "crossplanefn: exit-on-second-call: exiting with status 3 on call %d\n", n)
			os.Exit(3)
		}
	case "memory-hog":
		return nil, hogMemory(f.o.hogMax)
	case "network-probe":
		return f.probe(ctx, req)
	}
	return f.label(version, req)
}

// label is the normal function.
func (f *function) label(version string, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	rsp := to(req)
	labelled := 0
	for name, r := range rsp.GetDesired().GetResources() {
		if r.GetResource() == nil {
			r.Resource = &structpb.Struct{Fields: map[string]*structpb.Value{}}
		}
		if err := setLabel(r.Resource, f.o.labelKey, f.o.labelValue); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "desired resource %q: %v", name, err)
		}
		labelled++
	}
	// As function-sdk-go's response.Normalf: a Normal result for the XR.
	rsp.Results = append(rsp.Results, &fnv1.Result{
		Severity: fnv1.Severity_SEVERITY_NORMAL,
		Message: fmt.Sprintf("%s (%s): labelled %d desired composed resources with %s=%s",
			f.o.name, version, labelled, f.o.labelKey, f.o.labelValue),
		Target: fnv1.Target_TARGET_COMPOSITE.Enum(),
	})
	return rsp, nil
}

// to starts a response to req as function-sdk-go's response.To does (the
// request's tag, a ttl, the desired state and the context), with a desired
// state even when the request has none.
func to(req *fnv1.RunFunctionRequest) *fnv1.RunFunctionResponse {
	rsp := &fnv1.RunFunctionResponse{
		Meta:    &fnv1.ResponseMeta{Tag: req.GetMeta().GetTag(), Ttl: durationpb.New(responseTTL)},
		Desired: req.GetDesired(),
		Context: req.GetContext(),
	}
	if rsp.Desired == nil {
		rsp.Desired = &fnv1.State{}
	}
	return rsp
}

// setLabel sets metadata.labels[key] = value, making the maps it needs.
func setLabel(r *structpb.Struct, key, value string) error {
	metadata, err := child(r, "metadata")
	if err != nil {
		return err
	}
	labels, err := child(metadata, "labels")
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	labels.Fields[key] = structpb.NewStringValue(value)
	return nil
}

// child is the object field name of s, made if missing or null.
func child(s *structpb.Struct, name string) (*structpb.Struct, error) {
	if s.Fields == nil {
		s.Fields = map[string]*structpb.Value{}
	}
	v, ok := s.Fields[name]
	if !ok || isNull(v) {
		c := &structpb.Struct{Fields: map[string]*structpb.Value{}}
		s.Fields[name] = structpb.NewStructValue(c)
		return c, nil
	}
	c := v.GetStructValue()
	if c == nil {
		return nil, fmt.Errorf("%s is not an object", name)
	}
	if c.Fields == nil {
		c.Fields = map[string]*structpb.Value{}
	}
	return c, nil
}

func isNull(v *structpb.Value) bool {
	_, ok := v.GetKind().(*structpb.Value_NullValue)
	return ok
}

// failWith returns the status the request's input asks for with
// `failWith: {code: N, message: TEXT}`, so one image can show that a
// function's own status passes through unchanged.
func failWith(req *fnv1.RunFunctionRequest) error {
	fail := req.GetInput().GetFields()["failWith"].GetStructValue()
	if fail == nil {
		return nil
	}
	code := codes.Code(fail.GetFields()["code"].GetNumberValue())
	return status.Error(code, fail.GetFields()["message"].GetStringValue())
}

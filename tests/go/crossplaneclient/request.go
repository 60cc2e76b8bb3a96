package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
)

// readRequest reads a RunFunctionRequest in protojson from path (- for
// stdin), written as JSON or as YAML. Unknown fields are an error.
func readRequest(path string) (*fnv1.RunFunctionRequest, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, err
	}
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		if b, err = yamlToJSON(b); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	req := &fnv1.RunFunctionRequest{}
	if err := protojson.Unmarshal(b, req); err != nil {
		return nil, fmt.Errorf("%s is not a v1 RunFunctionRequest in protojson: %w", path, err)
	}
	return req, nil
}

// yamlToJSON converts one YAML document to JSON by its resolved tags, so
// that a string stays a string even when it looks like a timestamp.
func yamlToJSON(b []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	if doc.Kind == 0 {
		return []byte("{}"), nil
	}
	v, err := nodeValue(&doc)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

func nodeValue(n *yaml.Node) (interface{}, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return nil, fmt.Errorf("line %d: want one YAML document", n.Line)
		}
		return nodeValue(n.Content[0])
	case yaml.AliasNode:
		return nodeValue(n.Alias)
	case yaml.MappingNode:
		m := make(map[string]interface{}, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind != yaml.ScalarNode {
				return nil, fmt.Errorf("line %d: a mapping key must be a scalar", k.Line)
			}
			value, err := nodeValue(v)
			if err != nil {
				return nil, err
			}
			m[k.Value] = value
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]interface{}, 0, len(n.Content))
		for _, c := range n.Content {
			value, err := nodeValue(c)
			if err != nil {
				return nil, err
			}
			s = append(s, value)
		}
		return s, nil
	case yaml.ScalarNode:
		return scalar(n)
	}
	return nil, fmt.Errorf("line %d: unexpected YAML node", n.Line)
}

func scalar(n *yaml.Node) (interface{}, error) {
	switch n.ShortTag() {
	case "!!null":
		return nil, nil
	case "!!bool":
		var b bool
		err := n.Decode(&b)
		return b, err
	case "!!int":
		i, err := strconv.ParseInt(n.Value, 0, 64)
		if err != nil {
			var f float64
			err = n.Decode(&f)
			return f, err
		}
		return i, nil
	case "!!float":
		var f float64
		err := n.Decode(&f)
		return f, err
	}
	return n.Value, nil
}

// Command krmfn is a KRM function (the ResourceList contract of kpt,
// kustomize and Porch) written against Debian's gopkg.in/yaml.v3 only, built
// static and put in a test image.
//
// It reads a ResourceList on stdin and writes it back on stdout with the
// label named by its functionConfig (a ConfigMap: data.key, data.value) set
// on every item, and an info result saying how many it labelled. More keys
// of data make it misbehave on purpose:
//
//	fail: result   an error result about the first item (exit 0)
//	fail: exit     an error result, then exit 1 (as kpt's Go SDK does)
//	fail: crash    no output, "panic" on stderr, exit 2
//	env: NAME      the value of $NAME in an info result
//	dial: ADDR     an info result saying whether a TCP connection to ADDR opened
//	write: PATH    writes "written by krmfn" to PATH, and says whether it could
//	whoami: yes    the uid and gid it runs as in an info result
//	seen: PATH     writes the ResourceList it read, as it read it, to PATH
//	drop: KIND     removes the items of that kind
//	add: [NS/]NAME adds a ConfigMap NAME (in namespace NS), without a path
//	move: NAME=P   sets the legacy path annotation of the item NAME to P
//	               (config.kubernetes.io/path only, as a function written
//	               for an older kpt would)
//
// Everything it logs goes to stderr, prefixed "krmfn: ".
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

type resultItem struct {
	Message     string       `yaml:"message"`
	Severity    string       `yaml:"severity"`
	ResourceRef *resourceRef `yaml:"resourceRef,omitempty"`
}

type resourceRef struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Name       string `yaml:"name"`
	Namespace  string `yaml:"namespace,omitempty"`
}

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		die("cannot read stdin: %v", err)
	}
	var rl map[string]interface{}
	if err := yaml.Unmarshal(in, &rl); err != nil {
		die("input is not YAML: %v", err)
	}
	if rl["kind"] != "ResourceList" {
		die("input is not a ResourceList but a %v", rl["kind"])
	}
	data := map[string]interface{}{}
	if fc, ok := rl["functionConfig"].(map[string]interface{}); ok {
		if d, ok := fc["data"].(map[string]interface{}); ok {
			data = d
		}
	}
	str := func(key string) string {
		s, _ := data[key].(string)
		return s
	}
	if str("fail") == "crash" {
		fmt.Fprintln(os.Stderr, "krmfn: panic: asked to crash")
		os.Exit(2)
	}
	if path := str("seen"); path != "" {
		if err := os.WriteFile(path, in, 0o644); err != nil {
			die("cannot write %s: %v", path, err)
		}
	}
	key, value := str("key"), str("value")
	if key == "" {
		key = "krmfn"
	}
	items, _ := rl["items"].([]interface{})
	if kind := str("drop"); kind != "" {
		kept := []interface{}{}
		for _, item := range items {
			if obj, ok := item.(map[string]interface{}); !ok || obj["kind"] != kind {
				kept = append(kept, item)
			}
		}
		items = kept
	}
	if name := str("add"); name != "" {
		meta := map[string]interface{}{"name": name}
		if i := strings.Index(name, "/"); i >= 0 {
			meta = map[string]interface{}{"namespace": name[:i], "name": name[i+1:]}
		}
		items = append(items, map[string]interface{}{
			"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
			"data": map[string]interface{}{"added": "yes"},
		})
	}
	if move := str("move"); move != "" {
		name, path, _ := strings.Cut(move, "=")
		for _, item := range items {
			obj, _ := item.(map[string]interface{})
			meta, _ := obj["metadata"].(map[string]interface{})
			if meta == nil || meta["name"] != name {
				continue
			}
			annotations, _ := meta["annotations"].(map[string]interface{})
			if annotations == nil {
				annotations = map[string]interface{}{}
				meta["annotations"] = annotations
			}
			annotations["config.kubernetes.io/path"] = path
		}
	}
	rl["items"] = items
	var results []resultItem
	var first *resourceRef
	for _, item := range items {
		obj, ok := item.(map[string]interface{})
		if !ok {
			continue
		}
		meta, _ := obj["metadata"].(map[string]interface{})
		if meta == nil {
			meta = map[string]interface{}{}
			obj["metadata"] = meta
		}
		labels, _ := meta["labels"].(map[string]interface{})
		if labels == nil {
			labels = map[string]interface{}{}
			meta["labels"] = labels
		}
		labels[key] = value
		if first == nil {
			first = &resourceRef{
				APIVersion: fmt.Sprint(obj["apiVersion"]),
				Kind:       fmt.Sprint(obj["kind"]),
				Name:       fmt.Sprint(meta["name"]),
			}
			if ns, ok := meta["namespace"].(string); ok {
				first.Namespace = ns
			}
		}
	}
	results = append(results, resultItem{
		Message:  fmt.Sprintf("labelled %d resources with %s=%s", len(items), key, value),
		Severity: "info",
	})
	if name := str("env"); name != "" {
		v, set := os.LookupEnv(name)
		results = append(results, resultItem{Message: fmt.Sprintf("env %s=%q set=%v", name, v, set), Severity: "info"})
	}
	if addr := str("dial"); addr != "" {
		msg := "dial " + addr + ": connected"
		if conn, err := net.DialTimeout("tcp", addr, 3*time.Second); err != nil {
			msg = "dial " + addr + ": failed"
		} else {
			conn.Close()
		}
		results = append(results, resultItem{Message: msg, Severity: "info"})
	}
	if path := str("write"); path != "" {
		msg := "write " + path + ": ok"
		if err := os.WriteFile(path, []byte("written by krmfn\n"), 0o644); err != nil {
			msg = "write " + path + ": " + err.Error()
		}
		results = append(results, resultItem{Message: msg, Severity: "info"})
	}
	if str("whoami") == "yes" {
		results = append(results, resultItem{Message: fmt.Sprintf("uid=%d gid=%d", os.Getuid(), os.Getgid()), Severity: "info"})
	}
	failing := str("fail") == "result" || str("fail") == "exit"
	if failing {
		results = append(results, resultItem{Message: "value is not allowed", Severity: "error", ResourceRef: first})
	}
	rl["results"] = results
	out, err := yaml.Marshal(rl)
	if err != nil {
		die("cannot write the output: %v", err)
	}
	os.Stdout.Write(out)
	fmt.Fprintf(os.Stderr, "krmfn: labelled %d resources\n", len(items))
	if str("fail") == "exit" {
		os.Exit(1)
	}
}

func die(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "krmfn: "+format+"\n", args...)
	os.Exit(1)
}

package main

import (
	"math"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
)

// summary is what -calls N prints: how the calls ended and how long they
// took, in milliseconds.
type summary struct {
	Calls       int            `json:"calls"`
	Concurrency int            `json:"concurrency"`
	OK          int            `json:"ok"`
	Codes       map[string]int `json:"codes"`
	Versions    map[string]int `json:"versions"`
	FirstError  string         `json:"first_error"`
	ElapsedMS   float64        `json:"elapsed_ms"`
	PerSecond   float64        `json:"calls_per_second"`
	LatencyMS   latency        `json:"latency_ms"`
}

type latency struct {
	Min  float64 `json:"min"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

type sample struct {
	took    time.Duration
	version string
	err     error
}

// bench makes n calls, c at a time, on the caller's one connection.
func (c *caller) bench(req *fnv1.RunFunctionRequest, n, concurrency int) *summary {
	samples := make([]sample, n)
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t := time.Now()
				_, version, _, err := c.call(req)
				samples[i] = sample{took: time.Since(t), version: version, err: err}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)

	s := &summary{
		Calls:       n,
		Concurrency: concurrency,
		Codes:       map[string]int{},
		Versions:    map[string]int{},
		ElapsedMS:   ms(elapsed),
		PerSecond:   float64(n) / elapsed.Seconds(),
	}
	took := make([]float64, 0, n)
	var total float64
	for _, x := range samples {
		code := status.Code(x.err)
		s.Codes[code.String()]++
		s.Versions[x.version]++
		if x.err == nil {
			s.OK++
		} else if s.FirstError == "" {
			s.FirstError = x.err.Error()
		}
		took = append(took, ms(x.took))
		total += ms(x.took)
	}
	sort.Float64s(took)
	s.LatencyMS = latency{
		Min:  took[0],
		Mean: total / float64(n),
		P50:  percentile(took, 50),
		P90:  percentile(took, 90),
		P99:  percentile(took, 99),
		Max:  took[len(took)-1],
	}
	return s
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

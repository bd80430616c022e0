package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/queen-mq/queen/internal/broker"
)

// newRegistry builds the registry /metrics/prometheus serves: the broker's
// metrics, HTTP latencies, and the Go runtime's.
func (s *Server) newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	s.httpLat = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "queen_http_request_seconds",
		Help:    "HTTP request latency by tenant, route and status (long polls included).",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 20),
	}, []string{"tenant", "route", "code"})
	reg.MustRegister(s.httpLat, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := s.b.Register(reg); err != nil {
		s.log.Error("registering broker metrics failed", "err", err)
	}
	return reg
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{ErrorLog: nil})
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.code = code
	r.ResponseWriter.WriteHeader(code)
}

// timed records a handler's latency under its route pattern.
func (s *Server) timed(route string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, code: 200}
		if r.Method == http.MethodGet && strings.Contains(r.URL.RawQuery, "consistency") {
			// consistency=stale: an explicit opt-in to read this node's
			// own state without the leader (status pages).
			switch c := r.URL.Query().Get("consistency"); c {
			case "", "null", "linearizable":
			case "stale":
				r = r.WithContext(broker.AllowStale(r.Context()))
			default:
				writeError(rec, &broker.Error{Status: 400, Code: "invalid_parameter", Field: "consistency", Message: fmt.Sprintf("consistency must be linearizable (the default) or stale, got %q", c)})
				s.httpLat.WithLabelValues(s.tenant(r), route, strconv.Itoa(rec.code)).Observe(time.Since(start).Seconds())
				return
			}
		}
		h(rec, r)
		s.httpLat.WithLabelValues(s.tenant(r), route, strconv.Itoa(rec.code)).Observe(time.Since(start).Seconds())
	}
}

package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
		h(rec, r)
		s.httpLat.WithLabelValues(s.tenant(r), route, strconv.Itoa(rec.code)).Observe(time.Since(start).Seconds())
	}
}

package httpapi

import (
	"net/http"
	"net/url"
	"testing"
)

// TestQueryGetMatchesURLQuery: queryGet answers what r.URL.Query().Get
// answers, for plain queries (read in place) and for the ones it leaves to
// url.ParseQuery.
func TestQueryGetMatchesURLQuery(t *testing.T) {
	queries := []string{
		"", "batch=10", "batch=10&batch=20", "&&batch=10&", "batch", "batch=", "=5&batch=3",
		"batchx=1&batch=2", "xbatch=1", "batch=1=2", "batch=a%20b", "batch=a+b", "bat%63h=7",
		"batch=1;x=2&batch=3", "batch=1&x=2;y", "consumerGroup=g&batch=100&partitions=10&subscriptionMode=all",
		"batch=%zz&batch=4", "b%61tch=1&batch=2",
	}
	names := []string{"batch", "x", "partitions", "consumerGroup", "subscriptionMode", ""}
	for _, q := range queries {
		r := &http.Request{URL: &url.URL{RawQuery: q}}
		for _, n := range names {
			if got, want := queryGet(r, n), r.URL.Query().Get(n); got != want {
				t.Errorf("query %q, name %q: queryGet %q, URL.Query().Get %q", q, n, got, want)
			}
		}
	}
}

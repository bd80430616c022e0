// Package httpapi is the HTTP face of the broker (docs/http-api.md): routing, decoding
// and validating requests, the error shape and the mapping of the broker's
// error codes to HTTP statuses (errors.go), and encoding replies. It holds no
// state of its own and calls only the broker's Go API. Payloads pass through
// as raw JSON bytes and are never decoded.
package httpapi

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"time"
)

// rawConn is a lean HTTP/1.1 client over one kept-alive TCP connection, for
// -queen-client raw: it writes a request in one call and reads the reply
// into the caller's buffer, with no goroutine, header map or request object
// per exchange. It speaks only what the bench sends (no TLS, no redirects,
// no proxies); replies with Content-Length or chunked bodies are read. It
// exists so that the client's CPU, which shares this machine's cores with
// the server, is closer to what nats.go spends on JetStream's side.
type rawConn struct {
	host string // host:port to dial
	c    net.Conn
	r    *bufio.Reader
	req  []byte
}

// checkRawBase reports whether base is an http://host:port URL the lean
// client can dial.
func checkRawBase(base string) error {
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "http" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("-queen-client raw: base %q is not an http://host:port URL (use -queen-client std for https)", base)
	}
	return nil
}

func (rc *rawConn) close() {
	if rc.c != nil {
		rc.c.Close()
		rc.c, rc.r = nil, nil
	}
}

// do sends one request and reads the whole reply body into resp. A GET that
// fails on a reused connection before any reply came back is sent once more
// on a new one (the server may have closed the idle connection); a POST is
// never sent twice, since a push written once may have been taken.
func (rc *rawConn) do(ctx context.Context, method, path string, body []byte, resp *bytes.Buffer) (int, error) {
	reused := rc.c != nil
	st, gotReply, err := rc.once(ctx, method, path, body, resp)
	if err != nil && reused && !gotReply && ctx.Err() == nil && method == "GET" {
		st, _, err = rc.once(ctx, method, path, body, resp)
	}
	return st, err
}

func (rc *rawConn) once(ctx context.Context, method, path string, body []byte, resp *bytes.Buffer) (status int, gotReply bool, err error) {
	if rc.c == nil {
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err := d.DialContext(ctx, "tcp", rc.host)
		if err != nil {
			return 0, false, fmt.Errorf("dial %s: %w", rc.host, err)
		}
		rc.c, rc.r = c, bufio.NewReaderSize(c, 64<<10)
	}
	if dl, ok := ctx.Deadline(); ok {
		rc.c.SetDeadline(dl)
	} else {
		rc.c.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { rc.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	b := append(rc.req[:0], method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, rc.host...)
	b = append(b, "\r\nUser-Agent: queen-bench-raw\r\n"...)
	if body != nil {
		b = append(b, "Content-Type: application/json\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n\r\n"...)
		b = append(b, body...)
	} else {
		b = append(b, "\r\n"...)
	}
	rc.req = b
	if _, err := rc.c.Write(b); err != nil {
		rc.close()
		return 0, false, fmt.Errorf("%s %s: write: %w", method, path, err)
	}
	status, err = rc.readReply(resp)
	if err != nil {
		got := status != 0
		rc.close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return 0, got, fmt.Errorf("%s %s: read reply: %w", method, path, err)
	}
	return status, true, nil
}

var errBadReply = errors.New("malformed HTTP reply")

// readReply reads a status line, headers and body. It returns the status as
// soon as the status line is read, so that a caller can tell a reply that
// started from one that never came.
func (rc *rawConn) readReply(resp *bytes.Buffer) (int, error) {
	line, err := rc.line()
	if err != nil {
		return 0, err
	}
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, fmt.Errorf("%w: status line %q", errBadReply, line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("%w: status line %q", errBadReply, line)
	}
	length, chunked, closeAfter := int64(-1), false, false
	for {
		h, err := rc.line()
		if err != nil {
			return status, err
		}
		if len(h) == 0 {
			break
		}
		colon := bytes.IndexByte(h, ':')
		if colon <= 0 {
			return status, fmt.Errorf("%w: header %q", errBadReply, h)
		}
		name, val := h[:colon], bytes.TrimSpace(h[colon+1:])
		switch {
		case asciiEqualFold(name, "Content-Length"):
			if length, err = strconv.ParseInt(string(val), 10, 64); err != nil || length < 0 {
				return status, fmt.Errorf("%w: Content-Length %q", errBadReply, val)
			}
		case asciiEqualFold(name, "Transfer-Encoding"):
			chunked = asciiEqualFold(val, "chunked")
		case asciiEqualFold(name, "Connection"):
			closeAfter = asciiEqualFold(val, "close")
		}
	}
	resp.Reset()
	switch {
	case status == 204 || status == 304 || status/100 == 1:
	case chunked:
		if err := rc.readChunked(resp); err != nil {
			return status, err
		}
	case length >= 0:
		if _, err := io.CopyN(resp, rc.r, length); err != nil {
			return status, err
		}
	default:
		// No length: the body runs to the end of the connection.
		if _, err := resp.ReadFrom(rc.r); err != nil {
			return status, err
		}
		closeAfter = true
	}
	if closeAfter {
		rc.close()
	}
	return status, nil
}

func (rc *rawConn) readChunked(resp *bytes.Buffer) error {
	for {
		l, err := rc.line()
		if err != nil {
			return err
		}
		if i := bytes.IndexByte(l, ';'); i >= 0 {
			l = l[:i]
		}
		n, err := strconv.ParseInt(string(bytes.TrimSpace(l)), 16, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("%w: chunk size %q", errBadReply, l)
		}
		if n == 0 {
			for { // trailers up to the empty line
				t, err := rc.line()
				if err != nil {
					return err
				}
				if len(t) == 0 {
					return nil
				}
			}
		}
		if _, err := io.CopyN(resp, rc.r, n); err != nil {
			return err
		}
		if crlf, err := rc.line(); err != nil || len(crlf) != 0 {
			return fmt.Errorf("%w: no CRLF after a chunk", errBadReply)
		}
	}
}

// line reads one CRLF-terminated line without its terminator. The slice is
// valid until the next read.
func (rc *rawConn) line() ([]byte, error) {
	l, err := rc.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: a header line over %d bytes", errBadReply, rc.r.Size())
		}
		return nil, err
	}
	l = l[:len(l)-1]
	if n := len(l); n > 0 && l[n-1] == '\r' {
		l = l[:n-1]
	}
	return l, nil
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

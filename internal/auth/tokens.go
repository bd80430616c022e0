package auth

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// TokenEntry is one token of the tokens file: the sha256 of the token (64
// lowercase hex digits), the tenant it acts in and its role.
type TokenEntry struct {
	Hash   string
	Tenant string
	Role   Role
	// Line is where the entry starts in the file (1-based), for messages.
	Line int
}

// LoadTokens reads and parses a tokens file (see ParseTokens).
func LoadTokens(path string) ([]TokenEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("QUEEN_TOKENS_FILE: %w (point QUEEN_TOKENS_FILE at a readable tokens file, or unset it)", err)
	}
	return ParseTokens(path, data)
}

// ParseTokens parses the tokens file format; name is used in messages.
//
// Line format, one token per line, fields separated by spaces or tabs:
//
//	# comment
//	<sha256-hex-of-token> <tenant> <role>
//
// Blank lines and text after '#' are ignored. If the first non-blank
// character is '[', the file is instead a JSON array of
// {"tokenHash": "...", "tenant": "...", "role": "..."}.
//
// Every error names the line (or JSON entry) and says how to fix it. Token
// hashes are never echoed back, in case a raw token was pasted by mistake.
func ParseTokens(name string, data []byte) ([]TokenEntry, error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	var out []TokenEntry
	var err error
	if len(trimmed) > 0 && trimmed[0] == '[' {
		out, err = parseTokensJSON(name, data)
	} else {
		out, err = parseTokensLines(name, data)
	}
	if err != nil {
		return nil, err
	}
	seen := make(map[string]int, len(out))
	for _, e := range out {
		if first, dup := seen[e.Hash]; dup {
			return nil, fmt.Errorf("%s:%d: the same token hash is already listed on line %d; a token has one tenant and one role, so remove one of the two entries", name, e.Line, first)
		}
		seen[e.Hash] = e.Line
	}
	return out, nil
}

const tokenFix = "each line is `<sha256-hex-of-token> <tenant> <role>`, e.g. the output of `printf %s mytoken | sha256sum` followed by a tenant and read, write or admin (or * operator)"

func parseTokensLines(name string, data []byte) ([]TokenEntry, error) {
	var out []TokenEntry
	for i, line := range strings.Split(string(data), "\n") {
		n := i + 1
		if j := strings.IndexByte(line, '#'); j >= 0 {
			line = line[:j]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if len(fields) != 3 {
			return nil, fmt.Errorf("%s:%d: found %d fields, want 3; %s", name, n, len(fields), tokenFix)
		}
		e, err := makeEntry(fields[0], fields[1], fields[2])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %v", name, n, err)
		}
		e.Line = n
		out = append(out, e)
	}
	return out, nil
}

type jsonToken struct {
	TokenHash *string `json:"tokenHash"`
	Tenant    *string `json:"tenant"`
	Role      *string `json:"role"`
}

func parseTokensJSON(name string, data []byte) ([]TokenEntry, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var list []json.RawMessage
	if err := dec.Decode(&list); err != nil {
		return nil, fmt.Errorf("%s: %s; the file starts with '[' so it must be a JSON array of {\"tokenHash\", \"tenant\", \"role\"} objects", name, jsonErr(data, err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: text after the JSON array; the file must hold exactly one array", name)
	}
	// Offsets of each element, to name a line in messages.
	var out []TokenEntry
	off := 0
	for i, raw := range list {
		line := 1
		if k := bytes.Index(data[off:], raw); k >= 0 {
			off += k
			line = 1 + bytes.Count(data[:off], []byte("\n"))
			off += len(raw)
		}
		where := fmt.Sprintf("%s:%d: entry %d", name, line, i)
		var t jsonToken
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&t); err != nil {
			return nil, fmt.Errorf("%s: %v; each entry is an object {\"tokenHash\": \"<sha256 hex>\", \"tenant\": \"…\", \"role\": \"read|write|admin\"}", where, err)
		}
		switch {
		case t.TokenHash == nil:
			return nil, fmt.Errorf("%s: \"tokenHash\" is missing; set it to the sha256 hex of the token (`printf %%s mytoken | sha256sum`)", where)
		case t.Tenant == nil:
			return nil, fmt.Errorf("%s: \"tenant\" is missing; name the tenant the token acts in", where)
		case t.Role == nil:
			return nil, fmt.Errorf("%s: \"role\" is missing; set it to read, write or admin", where)
		}
		e, err := makeEntry(*t.TokenHash, *t.Tenant, *t.Role)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", where, err)
		}
		e.Line = line
		out = append(out, e)
	}
	return out, nil
}

func jsonErr(data []byte, err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) && se.Offset <= int64(len(data)) {
		return fmt.Sprintf("line %d: invalid JSON: %v", 1+bytes.Count(data[:se.Offset], []byte("\n")), err)
	}
	return "invalid JSON: " + err.Error()
}

func makeEntry(hash, tenant, role string) (TokenEntry, error) {
	if len(hash) != 64 {
		return TokenEntry{}, fmt.Errorf("the token hash has %d characters, want the 64 hex digits of its sha256 (`printf %%s mytoken | sha256sum`); put the hash in the file, never the token itself", len(hash))
	}
	if _, err := hex.DecodeString(hash); err != nil {
		return TokenEntry{}, fmt.Errorf("the token hash is not hexadecimal; want the 64 hex digits of the token's sha256 (`printf %%s mytoken | sha256sum`)")
	}
	r, err := ParseRole(role)
	if err != nil {
		return TokenEntry{}, err
	}
	switch {
	case r == RoleOperator && tenant != OperatorTenant:
		return TokenEntry{}, fmt.Errorf("the operator role belongs to no tenant; write the tenant as %s (`<hash> %s operator`)", OperatorTenant, OperatorTenant)
	case r != RoleOperator && tenant == OperatorTenant:
		return TokenEntry{}, fmt.Errorf("tenant %s is only for the operator role; name a tenant for a %s token", OperatorTenant, r)
	case r != RoleOperator:
		if err := ValidTenant(tenant); err != nil {
			return TokenEntry{}, fmt.Errorf("%v; tenant names follow the queue-name rule", err)
		}
	}
	return TokenEntry{Hash: strings.ToLower(hash), Tenant: tenant, Role: r}, nil
}

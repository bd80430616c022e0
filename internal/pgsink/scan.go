package pgsink

import (
	"encoding/json"
	"errors"
)

// errScan is a message the scanner cannot read as JSON.
var errScan = errors.New("invalid JSON")

// scanObject walks a JSON object's top level and calls fn with each key
// and its value's raw bytes, without decoding the values. It is the hot
// path of append and upsert; PostgreSQL parses the values itself.
func scanObject(raw []byte, fn func(key string, val []byte)) error {
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return errScan
	}
	i = skipWS(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return trailing(raw, i+1)
	}
	for {
		if i >= len(raw) || raw[i] != '"' {
			return errScan
		}
		end, escaped, err := skipString(raw, i)
		if err != nil {
			return err
		}
		var key string
		if escaped {
			if err := json.Unmarshal(raw[i:end], &key); err != nil {
				return errScan
			}
		} else {
			key = string(raw[i+1 : end-1])
		}
		i = skipWS(raw, end)
		if i >= len(raw) || raw[i] != ':' {
			return errScan
		}
		i = skipWS(raw, i+1)
		vend, err := skipValue(raw, i)
		if err != nil {
			return err
		}
		fn(key, raw[i:vend])
		i = skipWS(raw, vend)
		if i >= len(raw) {
			return errScan
		}
		if raw[i] == '}' {
			return trailing(raw, i+1)
		}
		if raw[i] != ',' {
			return errScan
		}
		i = skipWS(raw, i+1)
	}
}

func trailing(raw []byte, i int) error {
	if skipWS(raw, i) != len(raw) {
		return errScan
	}
	return nil
}

func skipWS(raw []byte, i int) int {
	for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at raw[i] == '"'.
func skipString(raw []byte, i int) (int, bool, error) {
	escaped := false
	for j := i + 1; j < len(raw); j++ {
		switch raw[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped, nil
		}
	}
	return 0, false, errScan
}

// skipValue returns the index after the value starting at raw[i].
func skipValue(raw []byte, i int) (int, error) {
	if i >= len(raw) {
		return 0, errScan
	}
	switch raw[i] {
	case '"':
		end, _, err := skipString(raw, i)
		return end, err
	case '{', '[':
		depth := 0
		for j := i; j < len(raw); j++ {
			switch raw[j] {
			case '"':
				end, _, err := skipString(raw, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errScan
	}
	j := i
	for j < len(raw) && raw[j] != ',' && raw[j] != '}' && raw[j] != ']' && raw[j] != ' ' && raw[j] != '\t' && raw[j] != '\n' && raw[j] != '\r' {
		j++
	}
	if j == i {
		return 0, errScan
	}
	return j, nil
}

package connector

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/queen-mq/queen/internal/broker"
)

// A sink document: its mode and the fields each mode allows, and the sql
// mode's statement and parameter paths.

// sinkParamFacts are the @ parameters of a sql sink.
var sinkParamFacts = []string{"@partition", "@partitionId", "@offset", "@transactionId", "@createdAt"}

func parseSink(name string, raw json.RawMessage) (*SinkSpec, *broker.Error) {
	o, e := parseObj("sink", raw)
	if e != nil {
		return nil, e
	}
	if e := o.only("queue", "table", "mode", "consumerGroup", "subscriptionMode", "key", "statement", "params",
		"metadata", "batch", "workers", "leaseSeconds", "maxAttempts", "progressTable", "createProgressTable"); e != nil {
		return nil, e
	}
	s := &SinkSpec{}
	var ok bool
	if s.Queue, ok, e = o.str("queue"); e != nil {
		return nil, e
	} else if !ok {
		return nil, invalidf("sink.queue", "sink.queue is required: the queue to consume")
	}
	if be := broker.ValidName("sink.queue", s.Queue); be != nil {
		be.Code = "invalid_connector"
		return nil, be
	}
	if s.Table, ok, e = o.str("table"); e != nil {
		return nil, e
	} else if !ok {
		return nil, invalidf("sink.table", `sink.table is required: "schema.name"`)
	}
	if err := validTableName(s.Table); err != nil {
		return nil, invalidf("sink.table", "%v", err)
	}
	mode, ok, e := o.str("mode")
	if e != nil {
		return nil, e
	}
	if !ok {
		return nil, invalidf("sink.mode", `sink.mode is required: "append", "upsert", "cdc" or "sql"`)
	}
	switch mode {
	case ModeAppend, ModeUpsert, ModeCDC, ModeSQL:
	default:
		return nil, invalidf("sink.mode", `sink.mode must be "append", "upsert", "cdc" or "sql", got %q`, mode)
	}
	s.Mode = mode
	if g, ok, e := o.str("consumerGroup"); e != nil {
		return nil, e
	} else if ok {
		if be := broker.ValidName("sink.consumerGroup", g); be != nil {
			be.Code = "invalid_connector"
			return nil, be
		}
		s.ConsumerGroup = g
	} else {
		s.ConsumerGroup = "pg-" + name
	}
	if s.SubscriptionMode, e = o.oneOf("subscriptionMode", "all", "all", "new"); e != nil {
		return nil, e
	}
	if key, ok, e := o.strList("key"); e != nil {
		return nil, e
	} else if ok {
		if mode != ModeUpsert && mode != ModeCDC {
			return nil, invalidf("sink.key", `sink.key is only for mode "upsert" or "cdc"; mode %q has no key`, mode)
		}
		if len(key) == 0 {
			return nil, invalidf("sink.key", "sink.key names at least one column; leave it out to use the primary key")
		}
		if e := checkColumns("sink.key", key); e != nil {
			return nil, e
		}
		s.Key = key
	}
	stmt, hasStmt, e := o.str("statement")
	if e != nil {
		return nil, e
	}
	params, hasParams, e := o.strList("params")
	if e != nil {
		return nil, e
	}
	if mode == ModeSQL {
		if !hasStmt || strings.TrimSpace(stmt) == "" {
			return nil, invalidf("sink.statement", `mode "sql" needs sink.statement: the statement to run once per message, with $1, $2, ... for sink.params`)
		}
		if len(stmt) > MaxStatementBytes {
			return nil, invalidf("sink.statement", "sink.statement is at most %d bytes (64 KiB), got %d", MaxStatementBytes, len(stmt))
		}
		if strings.ContainsRune(stmt, 0) || !utf8.ValidString(stmt) {
			return nil, invalidf("sink.statement", "sink.statement must be UTF-8 text without NUL characters")
		}
		if len(params) > MaxParams {
			return nil, invalidf("sink.params", "sink.params holds at most %d parameters, got %d", MaxParams, len(params))
		}
		for i, p := range params {
			if err := validParam(p); err != nil {
				return nil, invalidf(fmt.Sprintf("sink.params[%d]", i), "%v", err)
			}
		}
		s.Statement, s.Params = stmt, params
	} else {
		if hasStmt {
			return nil, invalidf("sink.statement", `sink.statement is only for mode "sql"; mode %q maps the message onto the table`, mode)
		}
		if hasParams {
			return nil, invalidf("sink.params", `sink.params is only for mode "sql"`)
		}
	}
	if mr, ok := o.raw("metadata"); ok {
		if mode != ModeAppend && mode != ModeUpsert {
			return nil, invalidf("sink.metadata", `sink.metadata is only for mode "append" or "upsert"`)
		}
		var md map[string]string
		if err := json.Unmarshal(mr, &md); err != nil {
			return nil, invalidf("sink.metadata", `sink.metadata must be an object of fact to column, e.g. {"offset": "queen_offset"}`)
		}
		cols := map[string]string{}
		for fact, col := range md {
			known := false
			for _, f := range MetadataFacts {
				known = known || f == fact
			}
			if !known {
				return nil, invalidf("sink.metadata."+fact, "unknown metadata fact %q; the facts are %s", fact, strings.Join(MetadataFacts, ", "))
			}
			if err := validIdent(col); err != nil {
				return nil, invalidf("sink.metadata."+fact, "column %v", err)
			}
			if other, dup := cols[col]; dup {
				a, b := other, fact
				if b < a {
					a, b = b, a
				}
				return nil, invalidf("sink.metadata."+b, "facts %q and %q both name column %q; give each its own column", a, b, col)
			}
			cols[col] = fact
		}
		if len(md) > 0 {
			s.Metadata = md
		}
	}
	if s.Batch, e = o.intIn("batch", DefaultBatch, 1, MaxBatch); e != nil {
		return nil, e
	}
	if s.Workers, e = o.intIn("workers", DefaultWorkers, 1, MaxWorkers); e != nil {
		return nil, e
	}
	if s.LeaseSeconds, e = o.intIn("leaseSeconds", DefaultLeaseSeconds, MinLeaseSeconds, MaxLeaseSeconds); e != nil {
		return nil, e
	}
	if s.MaxAttempts, e = o.intIn("maxAttempts", DefaultMaxAttempts, 1, MaxMaxAttempts); e != nil {
		return nil, e
	}
	if pt, ok, e := o.str("progressTable"); e != nil {
		return nil, e
	} else if ok {
		if err := validTableName(pt); err != nil {
			return nil, invalidf("sink.progressTable", "%v", err)
		}
		s.ProgressTable = pt
	} else {
		s.ProgressTable = DefaultProgressTable
	}
	if s.ProgressTable == s.Table {
		return nil, invalidf("sink.progressTable", "sink.progressTable must not be the target table %s; the sink keeps its offsets there", s.Table)
	}
	cpt, e := o.boolean("createProgressTable", true)
	if e != nil {
		return nil, e
	}
	s.CreateProgressTable = &cpt
	return s, nil
}

func checkColumns(field string, cols []string) *broker.Error {
	seen := map[string]bool{}
	for i, c := range cols {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := validIdent(c); err != nil {
			return invalidf(f, "column %v", err)
		}
		if seen[c] {
			return invalidf(f, "column %q is listed twice", c)
		}
		seen[c] = true
	}
	return nil
}

// validParam checks a sql sink parameter: "$", a path such as "$.a.b" or
// "$.lines[0]", or one of the @ facts.
func validParam(p string) error {
	if strings.HasPrefix(p, "@") {
		for _, f := range sinkParamFacts {
			if p == f {
				return nil
			}
		}
		return fmt.Errorf("unknown parameter %q; the @ parameters are %s", p, strings.Join(sinkParamFacts, ", "))
	}
	if _, err := ParsePath(p); err != nil {
		return err
	}
	return nil
}

// PathStep is one step of a parameter path: a key, or an index when Key is
// empty and IsIndex is set.
type PathStep struct {
	Key     string
	Index   int
	IsIndex bool
}

// ParsePath reads "$", "$.a.b", "$.lines[0]", "$[2].x".
func ParsePath(p string) ([]PathStep, error) {
	bad := func(why string) error {
		return fmt.Errorf("parameter %q: %s; a parameter is $ (the whole message), a path such as $.a.b or $.lines[0], or one of %s", p, why, strings.Join(sinkParamFacts, ", "))
	}
	if !strings.HasPrefix(p, "$") {
		return nil, bad("it does not start with $")
	}
	var steps []PathStep
	rest := p[1:]
	for rest != "" {
		switch rest[0] {
		case '.':
			rest = rest[1:]
			end := strings.IndexAny(rest, ".[")
			if end < 0 {
				end = len(rest)
			}
			if end == 0 {
				return nil, bad("a . is not followed by a key")
			}
			steps = append(steps, PathStep{Key: rest[:end]})
			rest = rest[end:]
		case '[':
			end := strings.IndexByte(rest, ']')
			if end < 0 {
				return nil, bad("a [ is not closed")
			}
			n, err := strconv.Atoi(rest[1:end])
			if err != nil || n < 0 || rest[1] == '+' {
				return nil, bad("an index is a whole number of 0 or more")
			}
			steps = append(steps, PathStep{Index: n, IsIndex: true})
			rest = rest[end+1:]
		default:
			return nil, bad("after $ comes .key or [index]")
		}
	}
	return steps, nil
}

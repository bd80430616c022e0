package connector

import (
	"encoding/json"
	"fmt"

	"github.com/queen-mq/queen/internal/broker"
)

// A source document: its tables and their partitioning, the snapshot,
// bundle and heartbeat settings, and the PostgreSQL names it derives.

// Partitioning of a source table (TableSpec.PartitionBy).
const (
	PartitionByKey    = "key"
	PartitionBySingle = "single"
)

// PartitionMode reads a validated PartitionBy: "key", "single", or
// "columns" with the columns.
func (t TableSpec) PartitionMode() (mode string, columns []string) {
	var s string
	if json.Unmarshal(t.PartitionBy, &s) == nil {
		if s == "" {
			return PartitionByKey, nil
		}
		return s, nil
	}
	if json.Unmarshal(t.PartitionBy, &columns) == nil && len(columns) > 0 {
		return "columns", columns
	}
	return PartitionByKey, nil
}

func parseSource(tenant, name string, raw json.RawMessage) (*SourceSpec, *broker.Error) {
	o, e := parseObj("source", raw)
	if e != nil {
		return nil, e
	}
	if e := o.only("tables", "slot", "publication", "managePublication", "snapshot", "snapshotChunkRows",
		"maxBundleMessages", "maxBundleBytes", "lingerMs", "heartbeatSeconds", "onTruncate"); e != nil {
		return nil, e
	}
	s := &SourceSpec{}
	rawTables, ok := o.raw("tables")
	if !ok {
		return nil, invalidf("source.tables", `source.tables is required: 1 to %d of {"table": "schema.name", "queue": "..."}`, MaxTables)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(rawTables, &list); err != nil {
		return nil, invalidf("source.tables", "source.tables must be an array of tables")
	}
	if len(list) < 1 || len(list) > MaxTables {
		return nil, invalidf("source.tables", "source.tables holds 1 to %d tables, got %d", MaxTables, len(list))
	}
	seen := map[string]int{}
	allSingle := true
	for i, tr := range list {
		path := fmt.Sprintf("source.tables[%d]", i)
		to, e := parseObj(path, tr)
		if e != nil {
			return nil, e
		}
		if e := to.only("table", "queue", "partitionBy"); e != nil {
			return nil, e
		}
		var t TableSpec
		var ok bool
		if t.Table, ok, e = to.str("table"); e != nil {
			return nil, e
		} else if !ok {
			return nil, invalidf(path+".table", `%s.table is required: "schema.name"`, path)
		}
		if err := validTableName(t.Table); err != nil {
			return nil, invalidf(path+".table", "%v", err)
		}
		if j, dup := seen[t.Table]; dup {
			return nil, invalidf(path+".table", "table %s is already listed as source.tables[%d]; list each table once", t.Table, j)
		}
		seen[t.Table] = i
		if t.Queue, ok, e = to.str("queue"); e != nil {
			return nil, e
		} else if !ok {
			return nil, invalidf(path+".queue", "%s.queue is required: the queue the table's changes go to", path)
		}
		if be := broker.ValidName(path+".queue", t.Queue); be != nil {
			be.Code = "invalid_connector"
			return nil, be
		}
		mode := PartitionByKey
		if pr, ok := to.raw("partitionBy"); ok {
			var str string
			var cols []string
			switch {
			case json.Unmarshal(pr, &str) == nil:
				if str != PartitionByKey && str != PartitionBySingle {
					return nil, invalidf(path+".partitionBy", `partitionBy must be "key", "single" or a list of columns, got %q`, str)
				}
				mode = str
			case json.Unmarshal(pr, &cols) == nil:
				if len(cols) == 0 {
					return nil, invalidf(path+".partitionBy", `partitionBy as a list names at least one column (or say "key" or "single")`)
				}
				dups := map[string]bool{}
				for j, c := range cols {
					if err := validIdent(c); err != nil {
						return nil, invalidf(fmt.Sprintf("%s.partitionBy[%d]", path, j), "column %v", err)
					}
					if dups[c] {
						return nil, invalidf(fmt.Sprintf("%s.partitionBy[%d]", path, j), "column %q is listed twice", c)
					}
					dups[c] = true
				}
				mode = "columns"
				pr, _ = json.Marshal(cols)
			default:
				return nil, invalidf(path+".partitionBy", `partitionBy must be "key", "single" or a list of columns`)
			}
			if mode != "columns" {
				pr, _ = json.Marshal(mode)
			}
			t.PartitionBy = pr
		} else {
			t.PartitionBy = json.RawMessage(`"key"`)
		}
		if mode != PartitionBySingle {
			allSingle = false
		}
		s.Tables = append(s.Tables, t)
	}
	def := DefaultSlotName(tenant, name)
	for _, f := range []struct {
		key string
		dst *string
	}{{"slot", &s.Slot}, {"publication", &s.Publication}} {
		v, ok, e := o.str(f.key)
		if e != nil {
			return nil, e
		}
		if !ok {
			v = def
		} else if err := validSlotName(v); err != nil {
			return nil, invalidf("source."+f.key, "source.%s %v", f.key, err)
		}
		*f.dst = v
	}
	mp, e := o.boolean("managePublication", true)
	if e != nil {
		return nil, e
	}
	s.ManagePublication = &mp
	if s.Snapshot, e = o.oneOf("snapshot", "initial", "initial", "never"); e != nil {
		return nil, e
	}
	if s.SnapshotChunkRows, e = o.intIn("snapshotChunkRows", DefaultSnapshotChunk, MinSnapshotChunk, MaxSnapshotChunk); e != nil {
		return nil, e
	}
	if s.MaxBundleMessages, e = o.intIn("maxBundleMessages", DefaultBundleMessages, 1, MaxBundleMessages); e != nil {
		return nil, e
	}
	if s.MaxBundleBytes, e = o.intIn("maxBundleBytes", DefaultBundleBytes, MinBundleBytes, MaxBundleBytes); e != nil {
		return nil, e
	}
	if s.LingerMs, e = o.intIn("lingerMs", DefaultLingerMs, 0, MaxLingerMs); e != nil {
		return nil, e
	}
	if s.HeartbeatSeconds, e = o.intIn("heartbeatSeconds", DefaultHeartbeatSeconds, 1, MaxHeartbeatSeconds); e != nil {
		return nil, e
	}
	if s.OnTruncate, e = o.oneOf("onTruncate", "skip", "skip", "emit"); e != nil {
		return nil, e
	}
	if s.OnTruncate == "emit" && !allSingle {
		return nil, invalidf("source.onTruncate", `onTruncate "emit" needs every table to be partitionBy "single": a truncate cannot be ordered against rows spread over many partitions`)
	}
	return s, nil
}

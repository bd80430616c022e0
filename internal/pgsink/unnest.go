package pgsink

import (
	"bytes"
	"strconv"
	"strings"
)

// Upserts whose columns all take COPY skip the staging table: each run is
// one INSERT ... SELECT unnest($1::type[]), unnest($2::type[]), ... ON
// CONFLICT, each column's values one array of the column's own type, bound
// as a text parameter of a statement prepared once per connection
// (upsertbind.go). array_in reads each element with the type's input
// function from the same characters as COPY (and the staging table) would;
// but no rows are copied into a temporary table, read back, and truncated
// at commit.
//
// A parameter, like a literal, is read as its type without the column's
// typmod and then cast to the typmod, which gives what the input function
// with the typmod gives (COPY, populate) for every type but two kinds. A
// character or bit type's length is left out of its array's type, and the
// INSERT's assignment applies it, as it does to a plain INSERT's text (an
// explicit cast would cut any value to size; the assignment, like the
// input function with the length, cuts only trailing spaces and refuses
// the rest); a domain's array keeps its name, domain_in applies the
// length. An interval with fields is read differently with its typmod
// ("1" is a minute for `interval minute`, a second without), so a table
// with one upserts through the staging table (copy.go).
//
// The unnest calls are in the select list, so they run in lockstep
// (arrays of one length, one row per element, in the arrays' order) with
// no function scan materializing them and no sort: the rows are inserted
// in the messages' order. The columns a message does not name are left
// out of the INSERT (DEFAULT) and out of the update, as before.

// unnestHead appends the INSERT of a run over cols up to its select list.
func (w *worker) unnestHead(sb *strings.Builder, cols []string) {
	sb.WriteString("INSERT INTO " + w.s.table.sql() + " (" + quoteCols(cols, "") + ") SELECT ")
}

// runFields splits a run's COPY lines (n fields each) into their fields,
// row by row.
func runFields(run []*op, n int) [][]byte {
	fields := make([][]byte, len(run)*n)
	for i, o := range run {
		line := o.copy
		for j := 0; j < n; j++ {
			end := bytes.IndexByte(line, '\t')
			if end < 0 || j == n-1 {
				end = len(line)
			}
			fields[i*n+j] = line[:end]
			line = line[min(end+1, len(line)):]
		}
	}
	return fields
}

// unnestParamSQL is the INSERT of a run over cols with its arrays as
// parameters $1, $2, ... (text, read as the arrays' types).
func (w *worker) unnestParamSQL(h *op) string {
	var sb strings.Builder
	w.unnestHead(&sb, h.cols)
	for j, c := range h.cols {
		if j > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("unnest($" + strconv.Itoa(j+1) + "::" + w.plan.copy.elems[c] + "[])")
	}
	sb.WriteString(w.onConflict(h))
	return sb.String()
}

// unnestParams is a run's columns' values, each column one array in its
// text form (array_in's, with no string constant around it).
func unnestParams(run []*op) [][]byte {
	n := len(run[0].cols)
	fields := runFields(run, n)
	params := make([][]byte, n)
	for j := range params {
		size := 2
		for i := range run {
			size += len(fields[i*n+j]) + 3
		}
		a := make([]byte, 0, size)
		a = append(a, '{')
		for i := range run {
			if i > 0 {
				a = append(a, ',')
			}
			a = appendArrayElement(a, fields[i*n+j])
		}
		params[j] = append(a, '}')
	}
	return params
}

// appendArrayElement appends a COPY text field (copytext.go: \\N for NULL,
// and only \\\\, \\n, \\r and \\t escaped) as an element of an array's text form: NULL for \N, else the value in double quotes with "
// and \ escaped by a backslash.
func appendArrayElement(a, f []byte) []byte {
	if len(f) == 2 && f[0] == '\\' && f[1] == 'N' {
		return append(a, "NULL"...)
	}
	a = append(a, '"')
	for {
		i := bytes.IndexAny(f, "\\\"")
		if i < 0 {
			a = append(a, f...)
			break
		}
		a = append(a, f[:i]...)
		if f[i] == '"' {
			a = append(a, '\\', '"')
		} else {
			i++
			switch f[i] {
			case '\\':
				a = append(a, '\\', '\\')
			case 'n':
				a = append(a, '\n')
			case 'r':
				a = append(a, '\r')
			case 't':
				a = append(a, '\t')
			}
		}
		f = f[i+1:]
	}
	return append(a, '"')
}

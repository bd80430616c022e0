package pgsink

import (
	"bytes"
	"strconv"
	"strings"
)

// Upserts whose columns all take COPY skip the staging table: each run is
// one INSERT ... SELECT ... FROM unnest(...) ON CONFLICT, its columns'
// values given as array literals of the columns' own types, each an escape
// string constant (E'{"…","…",NULL}'::numeric(12,2)[]). A literal cast to
// a type is read by the type's input function with the column's typmod,
// and array_in reads each element the same way, so every value is
// converted from the same characters by the same function as COPY (and
// the staging table) would; but no rows are copied into a temporary
// table, read back, and truncated at commit. One exception: a character or
// bit type's length is left out of its array's type, and the INSERT's
// assignment applies it, as it does to a plain INSERT's text (an explicit
// cast would cut any value to size; the assignment, like the input
// function with the length, cuts only trailing spaces and refuses the
// rest). A domain's array keeps its name: domain_in applies the length. The rows keep their order (WITH ORDINALITY), the
// columns a message does not name are left out of the INSERT (DEFAULT)
// and out of the update, as before.

// unnestRun appends the INSERT of one upsert run whose rows all take COPY.
func (w *worker) unnestRun(sb *strings.Builder, run []*op) {
	h := run[0]
	n := len(h.cols)
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
	sb.WriteString("INSERT INTO " + w.s.table.sql() + " (" + quoteCols(h.cols, "") + ") SELECT ")
	for j := 0; j < n; j++ {
		if j > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("q" + strconv.Itoa(j))
	}
	sb.WriteString(" FROM unnest(")
	for j, c := range h.cols {
		if j > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString("E'{")
		for i := range run {
			if i > 0 {
				sb.WriteByte(',')
			}
			appendElement(sb, fields[i*n+j])
		}
		sb.WriteString("}'::" + w.plan.copy.elems[c] + "[]")
	}
	sb.WriteString(") WITH ORDINALITY AS v(")
	for j := 0; j < n; j++ {
		sb.WriteString("q" + strconv.Itoa(j) + ", ")
	}
	sb.WriteString("queen_ord) ORDER BY queen_ord")
	sb.WriteString(w.onConflict(h))
}

// appendElement appends a COPY text field (copytext.go: \N for NULL, and
// only \\, \n, \r and \t escaped) as an element of an array literal, inside
// an escape string constant (E'...').
func appendElement(sb *strings.Builder, f []byte) {
	if len(f) == 2 && f[0] == '\\' && f[1] == 'N' {
		sb.WriteString("NULL")
		return
	}
	sb.WriteByte('"')
	for {
		i := bytes.IndexAny(f, "\\\"'")
		if i < 0 {
			sb.Write(f)
			break
		}
		sb.Write(f[:i])
		switch f[i] {
		case '\\':
			i++
			switch f[i] {
			case '\\':
				sb.WriteString(`\\\\`) // \ in the array, \\ in the constant
			case 'n':
				sb.WriteByte('\n')
			case 'r':
				sb.WriteByte('\r')
			case 't':
				sb.WriteByte('\t')
			}
		case '"':
			sb.WriteString(`\\"`)
		case '\'':
			sb.WriteString(`''`)
		}
		f = f[i+1:]
	}
	sb.WriteByte('"')
}

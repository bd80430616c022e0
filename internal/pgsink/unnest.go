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
// row by row, into buf's storage when it is large enough.
func runFields(buf [][]byte, run []*op, n int) [][]byte {
	fields := buf[:0]
	if cap(fields) < len(run)*n {
		fields = make([][]byte, len(run)*n)
	}
	fields = fields[:len(run)*n]
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

// unnestParams is a run's columns' values, each column one array, and
// their formats: binary (array_send's form) for a column of type text,
// whose receive function takes an element's bytes as its input function
// takes its characters, so PostgreSQL parses no element, and for a column
// of a type with an exact binary form (copybinary.go) when every element
// has it; the text form (array_in's, with no string constant around it)
// otherwise. Both are read without the column's typmod and then cast to
// it. A domain's, varchar's or char's receive function is not its input
// function on the same characters, so they stay text. formats is nil
// when every array is text.
func (w *worker) unnestParams(run []*op) (params [][]byte, formats []int16) {
	n := len(run[0].cols)
	fields := runFields(w.fields, run, n)
	defer func() {
		clear(fields) // the scratch does not keep the lines alive
		w.fields = fields[:0]
	}()
	params = make([][]byte, n)
	for j, c := range run[0].cols {
		k := w.plan.copy.binArray[c]
		if w.plan.copy.binText[c] {
			k = binText
		}
		if k != binNone && !textArraysOnly {
			if a, ok := binaryArray(fields, n, j, len(run), k); ok {
				if k != binText {
					w.s.typedArrays.Add(1)
				}
				if formats == nil {
					formats = make([]int16, n)
				}
				formats[j], params[j] = 1, a
				continue
			}
		}
		params[j] = textArray(fields, n, j, len(run))
	}
	return params, formats
}

// textArraysOnly is for benchmarks: every array in text format, as
// before the binary text arrays.
var textArraysOnly bool

// textArray is column j of rows COPY fields (n a row) as an array's text
// form.
func textArray(fields [][]byte, n, j, rows int) []byte {
	size := 2
	for i := 0; i < rows; i++ {
		size += len(fields[i*n+j]) + 3
	}
	a := make([]byte, 0, size)
	a = append(a, '{')
	for i := 0; i < rows; i++ {
		if i > 0 {
			a = append(a, ',')
		}
		a = appendArrayElement(a, fields[i*n+j])
	}
	return append(a, '}')
}

// textArrayBinary is column j of rows COPY fields (n a row) as a
// one-dimensional text[] in binary format: the number of dimensions, the
// has-nulls flag, the element type, the length and lower bound, then each
// element's length (-1 for NULL) and bytes. It says no for a field with
// an escape COPY text may have but copytext.go never writes.
func textArrayBinary(fields [][]byte, n, j, rows int) ([]byte, bool) {
	return binaryArray(fields, n, j, rows, binText)
}

// appendCopyUnescaped appends the characters of a COPY text field
// (the four escapes appendCopyEscaped writes), or says no for
// another escape.
func appendCopyUnescaped(a, f []byte) ([]byte, bool) {
	for {
		i := bytes.IndexByte(f, '\\')
		if i < 0 {
			return append(a, f...), true
		}
		if i+1 >= len(f) {
			return a, false
		}
		c, ok := copyUnescape(f[i+1])
		if !ok {
			return a, false
		}
		a = append(append(a, f[:i]...), c)
		f = f[i+2:]
	}
}

// copyUnescape returns the character a COPY text field's escape \c
// stands for, for the four escapes appendCopyEscaped writes.
func copyUnescape(c byte) (byte, bool) {
	switch c {
	case '\\':
		return '\\', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	}
	return 0, false
}

// appendArrayElement appends a COPY text field (copytext.go: \\N for NULL,
// and only \\\\, \\n, \\r and \\t escaped) as an element of an array's
// text form: NULL for \N, else the value in double quotes with " and \
// escaped by a backslash.
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
			switch c, ok := copyUnescape(f[i]); {
			case c == '\\':
				a = append(a, '\\', '\\')
			case ok:
				a = append(a, c)
			}
		}
		f = f[i+1:]
	}
	return append(a, '"')
}

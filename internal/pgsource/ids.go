package pgsource

import (
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
)

// appendLSN appends an LSN as PostgreSQL prints it ("0/1570D68").
func appendLSN(buf []byte, lsn pglogrepl.LSN) []byte {
	buf = appendHexUpper(buf, uint64(lsn>>32), 0)
	buf = append(buf, '/')
	return appendHexUpper(buf, uint64(uint32(lsn)), 0)
}

// appendHexUpper appends v in upper-case hex, zero-padded to width digits.
func appendHexUpper(buf []byte, v uint64, width int) []byte {
	const digits = "0123456789ABCDEF"
	var tmp [16]byte
	i := len(tmp)
	for v != 0 || i == len(tmp) {
		i--
		tmp[i] = digits[v&0xf]
		v >>= 4
	}
	for len(tmp)-i < width {
		i--
		tmp[i] = '0'
	}
	return append(buf, tmp[i:]...)
}

// changeID is the message id of a change: pg:<epoch>:<commit LSN in 16 hex
// digits>:<seq>, with ".1" for the second event of a key change.
func changeID(buf []byte, epoch string, commit pglogrepl.LSN, seq int, second bool) []byte {
	buf = append(buf, "pg:"...)
	buf = append(buf, epoch...)
	buf = append(buf, ':')
	buf = appendHexUpper(buf, uint64(commit), 16)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, int64(seq), 10)
	if second {
		buf = append(buf, ".1"...)
	}
	return buf
}

// snapshotID is the message id of a snapshot row (pg:<epoch>:s:<position>:<seq>)
// or, with fill, of a fill event (pg:<epoch>:s:<position>:f<seq>). The
// position is the chunk's high watermark in 16 hex digits.
func snapshotID(buf []byte, epoch string, position pglogrepl.LSN, seq int, fill bool) []byte {
	buf = append(buf, "pg:"...)
	buf = append(buf, epoch...)
	buf = append(buf, ":s:"...)
	buf = appendHexUpper(buf, uint64(position), 16)
	buf = append(buf, ':')
	if fill {
		buf = append(buf, 'f')
	}
	return strconv.AppendInt(buf, int64(seq), 10)
}

// appendTS appends a commit time as "2026-10-03T06:15:03.583036Z".
func appendTS(buf []byte, t time.Time) []byte {
	buf = append(buf, '"')
	buf = t.UTC().AppendFormat(buf, "2006-01-02T15:04:05.000000Z")
	return append(buf, '"')
}

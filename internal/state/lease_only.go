package state

// LeaseOnly reports whether an encoded entry (EncodeEntry) holds nothing but
// pops that lease (not autoAck). Losing such an entry in a power loss is the
// same event as its leases expiring, so the raft log may defer its fsync
// (docs/design/leases.md). Anything it cannot read is not lease-only.
func LeaseOnly(b []byte) bool {
	d := dec{b: b}
	if d.u8() != entryVersion {
		return false
	}
	d.i64()
	n := d.uv()
	if d.err != nil || n == 0 || n > uint64(len(b)) {
		return false
	}
	for i := uint64(0); i < n; i++ {
		if d.u8() != kindPop {
			return false
		}
		body := d.bytes()
		if d.err != nil || !leasingPop(body) {
			return false
		}
	}
	return d.err == nil && len(d.b) == 0
}

// leasingPop reads a pop's body (encodePop) as far as its autoAck flag,
// without allocating.
func leasingPop(b []byte) bool {
	d := dec{b: b}
	d.bytes() // tenant
	d.bytes() // queue
	if d.bool() {
		d.bytes() // partition
	}
	d.bytes() // group
	d.uv()    // batch
	d.uv()    // partitions
	d.i64()   // lease seconds
	autoAck := d.bool()
	return d.err == nil && !autoAck
}

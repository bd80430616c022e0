package state

import (
	"encoding/json"
)

// tenantID resolves a tenant name, creating the tenant when create is set.
func (t *txn) tenantID(name string, create bool) (uint32, bool) {
	if id, ok := t.tenants[name]; ok {
		return id, id != 0
	}
	if v := t.get(tenantKey(name)); len(v) == 4 {
		id := uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
		t.tenants[name] = id
		return id, true
	}
	if !create {
		return 0, false
	}
	id := t.m.NextTenant
	t.m.NextTenant++
	t.set(tenantKey(name), []byte{byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)})
	t.tenants[name] = id
	t.newTenants[id] = name
	return id, true
}

func (t *txn) queueIDByName(tid uint32, name string) uint64 {
	k := string(queueNameKey(tid, name))
	if id, ok := t.queueNames[k]; ok {
		return id
	}
	var id uint64
	if v := t.get([]byte(k)); len(v) == 8 {
		id = lastU64(v)
	}
	t.queueNames[k] = id
	return id
}

func (t *txn) queue(tid uint32, qid uint64) *queueRec {
	if qid == 0 {
		return nil
	}
	k := string(queueKey(tid, qid))
	if q, ok := t.queues[k]; ok {
		return q
	}
	var q *queueRec
	if v := t.get([]byte(k)); v != nil {
		q = &queueRec{}
		if err := json.Unmarshal(v, q); err != nil {
			t.corrupt([]byte(k), "queue", err)
			q = nil
		}
	}
	t.queues[k] = q
	return q
}

func (t *txn) queueByName(tid uint32, name string) *queueRec {
	return t.queue(tid, t.queueIDByName(tid, name))
}

func (t *txn) createQueue(tid uint32, name string) *queueRec {
	q := &queueRec{ID: t.m.NextQueue, Name: name, CreatedAt: t.now, Options: DefaultQueueOptions()}
	t.m.NextQueue++
	nk := queueNameKey(tid, name)
	t.set(nk, binaryU64(q.ID))
	t.queueNames[string(nk)] = q.ID
	k := string(queueKey(tid, q.ID))
	t.queues[k] = q
	t.dirty[k] = q
	// Queue mode is a subscription that reads from the oldest message.
	t.createSub(tid, q, QueueModeGroup, StartAll, 0, 0)
	return q
}

func (t *txn) markQueue(tid uint32, q *queueRec) { t.dirty[string(queueKey(tid, q.ID))] = q }

func binaryU64(v uint64) []byte {
	return []byte{byte(v >> 56), byte(v >> 48), byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

func (t *txn) tenantNameOf(tid uint32) string {
	if name, ok := t.newTenants[tid]; ok {
		return name
	}
	return t.s.tenantName(tid)
}

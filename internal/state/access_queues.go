package state

import (
	"encoding/json"
)

// tenantID resolves a tenant name, creating the tenant when create is set.
func (ac *applyCtx) tenantID(name string, create bool) (uint32, bool) {
	if id, ok := ac.tenants[name]; ok {
		return id, id != 0
	}
	if v := ac.get(tenantKey(name)); len(v) == 4 {
		id := uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
		ac.tenants[name] = id
		return id, true
	}
	if !create {
		return 0, false
	}
	id := ac.m.NextTenant
	ac.m.NextTenant++
	ac.set(tenantKey(name), []byte{byte(id >> 24), byte(id >> 16), byte(id >> 8), byte(id)})
	ac.tenants[name] = id
	ac.newTenants[id] = name
	return id, true
}

func (ac *applyCtx) queueIDByName(tid uint32, name string) uint64 {
	k := string(queueNameKey(tid, name))
	if id, ok := ac.queueNames[k]; ok {
		return id
	}
	var id uint64
	if v := ac.get([]byte(k)); len(v) == 8 {
		id = lastU64(v)
	}
	ac.queueNames[k] = id
	return id
}

func (ac *applyCtx) queue(tid uint32, qid uint64) *queueRec {
	if qid == 0 {
		return nil
	}
	k := string(queueKey(tid, qid))
	if q, ok := ac.queues[k]; ok {
		return q
	}
	var q *queueRec
	if v := ac.get([]byte(k)); v != nil {
		q = &queueRec{}
		if err := json.Unmarshal(v, q); err != nil {
			ac.corrupt([]byte(k), "queue", err)
			q = nil
		}
	}
	ac.queues[k] = q
	return q
}

func (ac *applyCtx) queueByName(tid uint32, name string) *queueRec {
	return ac.queue(tid, ac.queueIDByName(tid, name))
}

func (ac *applyCtx) createQueue(tid uint32, name string) *queueRec {
	q := &queueRec{ID: ac.m.NextQueue, Name: name, CreatedAt: ac.now, Options: DefaultQueueOptions()}
	ac.m.NextQueue++
	nk := queueNameKey(tid, name)
	ac.set(nk, binaryU64(q.ID))
	ac.queueNames[string(nk)] = q.ID
	k := string(queueKey(tid, q.ID))
	ac.queues[k] = q
	ac.dirty[k] = q
	// Queue mode is a subscription that reads from the oldest message.
	ac.createSub(tid, q, QueueModeGroup, StartAll, 0, 0)
	return q
}

func (ac *applyCtx) markQueue(tid uint32, q *queueRec) { ac.dirty[string(queueKey(tid, q.ID))] = q }

func binaryU64(v uint64) []byte {
	return []byte{byte(v >> 56), byte(v >> 48), byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
}

func (ac *applyCtx) tenantNameOf(tid uint32) string {
	if name, ok := ac.newTenants[tid]; ok {
		return name
	}
	return ac.s.tenantName(tid)
}

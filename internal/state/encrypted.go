package state

import (
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// QueueEncrypted reports whether a queue is configured with
// encryptionEnabled (as of the last applied entry on this node).
func (s *Store) QueueEncrypted(tenant, queue string) bool {
	s.encMu.RLock()
	defer s.encMu.RUnlock()
	return s.encQueues[tenant+"\x00"+queue]
}

// EncryptedQueues counts the encrypted queues.
func (s *Store) EncryptedQueues() int {
	s.encMu.RLock()
	defer s.encMu.RUnlock()
	return len(s.encQueues)
}

// loadEncrypted scans the queue records for encrypted queues.
func (s *Store) loadEncrypted(names map[uint32]string) error {
	enc := map[string]bool{}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{tQueue}, UpperBound: []byte{tQueue + 1}})
	if err != nil {
		return fmt.Errorf("scan queues: %w", err)
	}
	for it.First(); it.Valid(); it.Next() {
		var q queueRec
		k := it.Key()
		if len(k) < 5 || json.Unmarshal(it.Value(), &q) != nil || !q.Options.EncryptionEnabled {
			continue
		}
		enc[names[binary.BigEndian.Uint32(k[1:5])]+"\x00"+q.Name] = true
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("scan queues: %w", err)
	}
	s.encMu.Lock()
	s.encQueues = enc
	s.encMu.Unlock()
	return nil
}

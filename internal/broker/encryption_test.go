package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/queen-mq/queen/internal/cluster"
)

const testKey = "8f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8"

func openAt(t *testing.T, dir, key string) *Broker {
	t.Helper()
	b, err := Open(Config{Cluster: cluster.Config{DataDir: dir, RaftAddr: freeAddr(t)}, EncryptionKey: key})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !b.Node().IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("no leader")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b
}

func TestEncryptionAtRest(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	b := openAt(t, dir, testKey)
	on := json.RawMessage("true")
	if _, err := b.Configure(ctx, ConfigureRequest{Tenant: "default", Queue: "secret", Options: map[string]json.RawMessage{"encryptionEnabled": on}}); err != nil {
		t.Fatal(err)
	}
	marker := "PLAINTEXT-MARKER-7f3e9c"
	payload := []byte(`{"card":"` + marker + `"}`)
	if _, err := b.Push(ctx, "default", []PushItem{{Queue: "secret", Partition: "p", Payload: payload}}); err != nil {
		t.Fatal(err)
	}
	// A transaction's push is sealed too.
	if _, err := b.Transaction(ctx, TxnRequest{Tenant: "default", Ops: []TxnOp{{Type: OpPush, Items: []PushItem{{Queue: "secret", Partition: "p", Payload: payload}}}}}); err != nil {
		t.Fatal(err)
	}
	r, err := b.Pop(ctx, PopRequest{Tenant: "default", Queue: "secret", Batch: 10, LeaseSeconds: 5})
	if err != nil || len(r.Messages) != 2 || !bytes.Equal(r.Messages[0].Data, payload) || !bytes.Equal(r.Messages[1].Data, payload) {
		t.Fatalf("pop from encrypted queue: %v %+v", err, r)
	}
	if err := b.Node().Store().DB().Flush(); err != nil {
		t.Fatal(err)
	}
	b.Close()
	// No file of the data directory holds the plaintext: not the Raft
	// log, not Pebble's WAL, memtable flushes or sstables.
	files := 0
	filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() {
			return nil
		}
		files++
		data, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("read %s: %v", path, err)
			return nil
		}
		if bytes.Contains(data, []byte(marker)) {
			t.Errorf("%s contains the plaintext payload", path)
		}
		return nil
	})
	if files < 5 {
		t.Fatalf("only %d files in the data directory; the scan proves nothing", files)
	}
	// A node without the key refuses instead of serving ciphertext.
	nb := openAt(t, dir, "")
	defer nb.Close()
	_, err = nb.Pop(ctx, PopRequest{Tenant: "default", Queue: "secret", Group: "other", SubscriptionMode: "all", Batch: 10})
	var be *Error
	if !errors.As(err, &be) || be.Code != "encryption_key_missing" {
		t.Fatalf("pop without the key = %v, want encryption_key_missing", err)
	}
	if _, err := nb.Push(ctx, "default", []PushItem{{Queue: "secret", Partition: "p", Payload: []byte(`1`)}}); !errors.As(err, &be) || be.Code != "encryption_key_missing" {
		t.Fatalf("push without the key = %v, want encryption_key_missing", err)
	}
	if _, err := nb.Configure(ctx, ConfigureRequest{Tenant: "default", Queue: "new", Options: map[string]json.RawMessage{"encryptionEnabled": on}}); !errors.As(err, &be) || be.Code != "encryption_key_missing" {
		t.Fatalf("configure encryption without the key = %v", err)
	}
}

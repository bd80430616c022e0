package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	natsPushStream    = "PUSH"
	natsConsumeStream = "CONS"
	natsLatencyStream = "LAT"
	natsSubjects      = "bench.>"
)

// natsSystem is an in-process nats-server with JetStream on file storage.
type natsSystem struct {
	cfg   *config
	sync  bool
	label string
	dir   string
	srv   natsServer
	url   string
}

func startNATSServer(dir string, syncAlways bool) (natsServer, error) {
	if natsInChild {
		return startNATSChild(dir, syncAlways)
	}
	opts := &server.Options{
		ServerName: "bench",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
		// SyncAlways is what `jetstream { sync_interval: always }` sets: every
		// message block write is followed by fsync. Without it the server syncs
		// every SyncInterval (default 2 minutes).
		SyncAlways: syncAlways,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("new nats server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, errors.New("nats server not ready after 15s")
	}
	jsc := s.JetStreamConfig()
	if jsc == nil {
		s.Shutdown()
		return nil, errors.New("nats server started without JetStream")
	}
	if jsc.SyncAlways != syncAlways {
		s.Shutdown()
		return nil, fmt.Errorf("nats server SyncAlways=%v, wanted %v", jsc.SyncAlways, syncAlways)
	}
	return s, nil
}

func newNATSSystem(_ context.Context, cfg *config, syncAlways bool) (*natsSystem, error) {
	label := sysJS
	if syncAlways {
		label = sysJSSync
	}
	dir, err := os.MkdirTemp(cfg.tmpDir, "bench-"+label+"-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	s, err := startNATSServer(dir, syncAlways)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &natsSystem{cfg: cfg, sync: syncAlways, label: label, dir: dir, srv: s, url: s.ClientURL()}, nil
}

func (n *natsSystem) name() string { return n.label }
func (n *natsSystem) serverPID() int {
	if c, ok := n.srv.(*natsChild); ok {
		return c.pid()
	}
	return 0
}

func (n *natsSystem) close() error {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
	if n.cfg.keep {
		fmt.Fprintf(os.Stderr, "%s: store kept in %s\n", n.label, n.dir)
		return nil
	}
	if err := os.RemoveAll(n.dir); err != nil {
		return fmt.Errorf("remove %s: %w", n.dir, err)
	}
	return nil
}

func connectJS(url, name string, opts ...jetstream.JetStreamOpt) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", url, err)
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream context: %w", err)
	}
	return nc, js, nil
}

// withAdmin runs f with a short-lived admin connection.
func withAdmin(ctx context.Context, url string, f func(ctx context.Context, js jetstream.JetStream) error) error {
	nc, js, err := connectJS(url, "bench-admin")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return f(ctx, js)
}

func recreateStream(ctx context.Context, js jetstream.JetStream, name string) error {
	for _, s := range []string{natsPushStream, natsConsumeStream, natsLatencyStream} {
		if err := js.DeleteStream(ctx, s); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("delete stream %s: %w", s, err)
		}
	}
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:      name,
		Subjects:  []string{natsSubjects},
		Storage:   jetstream.FileStorage,
		Replicas:  1,
		Retention: jetstream.LimitsPolicy,
	})
	if err != nil {
		return fmt.Errorf("create stream %s: %w", name, err)
	}
	return nil
}

func subjects(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "bench." + strconv.Itoa(i)
	}
	return out
}

// natsProducer publishes a batch as n PublishAsync calls, then waits for all n PubAcks.
type natsProducer struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	subs    []string
	payload []byte
	next    int
	futs    []jetstream.PubAckFuture
	ids     bool // a Nats-Msg-Id per message (-push-ids)
}

func newNATSProducer(url string, i, partitions, batch int, payload []byte, ids bool) (*natsProducer, error) {
	nc, js, err := connectJS(url, "bench-producer-"+strconv.Itoa(i), jetstream.WithPublishAsyncMaxPending(max(4096, 2*batch)))
	if err != nil {
		return nil, err
	}
	return &natsProducer{nc: nc, js: js, subs: subjects(partitions), payload: payload, ids: ids,
		next: i * 7919, futs: make([]jetstream.PubAckFuture, 0, batch)}, nil
}

func (p *natsProducer) send(ctx context.Context, n int) error {
	p.futs = p.futs[:0]
	for range n {
		subj := p.subs[p.next%len(p.subs)]
		p.next++
		var opts []jetstream.PublishOpt
		if p.ids {
			opts = append(opts, jetstream.WithMsgID(newTxID()))
		}
		f, err := p.js.PublishAsync(subj, p.payload, opts...)
		if err != nil {
			return fmt.Errorf("publish async to %s: %w", subj, err)
		}
		p.futs = append(p.futs, f)
	}
	for _, f := range p.futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("publish ack: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (p *natsProducer) close() { p.nc.Close() }

func (n *natsSystem) push(ctx context.Context, sc scenario, m *cpuMeter) result {
	err := withAdmin(ctx, n.url, func(ctx context.Context, js jetstream.JetStream) error {
		return recreateStream(ctx, js, natsPushStream)
	})
	if err != nil {
		return result{err: err}
	}
	payload := makePayload(sc.size)
	r := runPush(ctx, n.cfg, m, sc.clients, sc.batch, func(i int) (producer, error) {
		return newNATSProducer(n.url, i, sc.partitions, sc.batch, payload, sc.ids)
	})
	err = withAdmin(ctx, n.url, func(ctx context.Context, js jetstream.JetStream) error {
		return js.DeleteStream(ctx, natsPushStream)
	})
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("delete stream: %w", err)
	}
	return r
}

func (n *natsSystem) fill(ctx context.Context, url string) error {
	err := withAdmin(ctx, url, func(ctx context.Context, js jetstream.JetStream) error {
		return recreateStream(ctx, js, natsConsumeStream)
	})
	if err != nil {
		return err
	}
	payload := makePayload(30)
	return runFill(ctx, n.cfg, n.cfg.prefill, 100, func(i int) (producer, error) {
		return newNATSProducer(url, i, n.cfg.consPartitions, 100, payload, false)
	})
}

func (n *natsSystem) prefill(ctx context.Context) error {
	if n.sync && n.cfg.jsFastPrefill {
		// Fill the stream with a server that does not fsync every message, on
		// the same store directory, then come back with sync always: the fill is
		// not measured and would otherwise take one fsync per message.
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
		aux, err := startNATSServer(n.dir, false)
		if err != nil {
			return fmt.Errorf("start fill server: %w", err)
		}
		ferr := n.fill(ctx, aux.ClientURL())
		aux.Shutdown()
		aux.WaitForShutdown()
		s, err := startNATSServer(n.dir, true)
		if err != nil {
			return fmt.Errorf("restart with sync always: %w", err)
		}
		n.srv, n.url = s, s.ClientURL()
		if ferr != nil {
			return ferr
		}
	} else if err := n.fill(ctx, n.url); err != nil {
		return err
	}
	return withAdmin(ctx, n.url, func(ctx context.Context, js jetstream.JetStream) error {
		st, err := js.Stream(ctx, natsConsumeStream)
		if err != nil {
			return fmt.Errorf("stream %s: %w", natsConsumeStream, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			return fmt.Errorf("stream info: %w", err)
		}
		if info.State.Msgs != uint64(n.cfg.prefill) {
			return fmt.Errorf("stream %s holds %d messages after the fill, want %d", natsConsumeStream, info.State.Msgs, n.cfg.prefill)
		}
		return nil
	})
}

// natsConsumer: Fetch (no wait) a batch from a durable pull consumer, Ack every
// message but the last and DoubleAck (AckSync) the last one, so that one
// cycle ends when the server has processed the batch's acks.
type natsConsumer struct {
	nc    *nats.Conn
	cons  jetstream.Consumer
	batch int
	msgs  []jetstream.Msg
}

func (n *natsSystem) newConsumer(ctx context.Context, durable string, i int) (consumer, error) {
	nc, js, err := connectJS(n.url, "bench-consumer-"+durable+"-"+strconv.Itoa(i))
	if err != nil {
		return nil, err
	}
	cons, err := js.Consumer(ctx, natsConsumeStream, durable)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("consumer %s: %w", durable, err)
	}
	return &natsConsumer{nc: nc, cons: cons, batch: n.cfg.popBatch, msgs: make([]jetstream.Msg, 0, n.cfg.popBatch)}, nil
}

func (c *natsConsumer) cycle(ctx context.Context) (int, int, error) {
	b, err := c.cons.FetchNoWait(c.batch)
	if err != nil {
		return 0, 0, fmt.Errorf("fetch: %w", err)
	}
	c.msgs = c.msgs[:0]
	for msg := range b.Messages() {
		c.msgs = append(c.msgs, msg)
	}
	if err := b.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return 0, 0, fmt.Errorf("fetch: %w", err)
	}
	if len(c.msgs) == 0 {
		return 0, 0, nil
	}
	redelivered := 0
	last := len(c.msgs) - 1
	for i, msg := range c.msgs {
		if md, err := msg.Metadata(); err == nil && md.NumDelivered > 1 {
			redelivered++
		}
		if i == last {
			break
		}
		if err := msg.Ack(); err != nil {
			return 0, 0, fmt.Errorf("ack: %w", err)
		}
	}
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.msgs[last].DoubleAck(actx); err != nil {
		return 0, 0, fmt.Errorf("double ack: %w", err)
	}
	return len(c.msgs), redelivered, nil
}

func (c *natsConsumer) close() { c.nc.Close() }

func (n *natsSystem) createDurables(ctx context.Context, names []string) error {
	return withAdmin(ctx, n.url, func(ctx context.Context, js jetstream.JetStream) error {
		for _, d := range names {
			_, err := js.CreateOrUpdateConsumer(ctx, natsConsumeStream, jetstream.ConsumerConfig{
				Durable:       d,
				AckPolicy:     jetstream.AckExplicitPolicy,
				DeliverPolicy: jetstream.DeliverAllPolicy,
				// FetchNoWait's client gives up on a reply that has not started
				// within 1 s (it happens on an overloaded machine); the server
				// then holds those messages until AckWait ends. 10 s bounds that
				// stall; the report counts the redeliveries.
				AckWait:       10 * time.Second,
				MaxAckPending: 1 << 20,
				MaxWaiting:    1024,
			})
			if err != nil {
				return fmt.Errorf("create consumer %s: %w", d, err)
			}
		}
		return nil
	})
}

func (n *natsSystem) popAck(ctx context.Context, sc scenario, m *cpuMeter) result {
	group := "g" + strconv.Itoa(sc.clients)
	if err := n.createDurables(ctx, []string{group}); err != nil {
		return result{err: err}
	}
	return runConsume(ctx, n.cfg, m, []string{group}, sc.clients, int64(n.cfg.prefill),
		func(g string, i int) (consumer, error) { return n.newConsumer(ctx, g, i) })
}

func (n *natsSystem) fanOut(ctx context.Context, sc scenario, m *cpuMeter) result {
	groups := fanGroupNames(n.cfg, sc)
	if err := n.createDurables(ctx, groups); err != nil {
		return result{err: err}
	}
	return runConsume(ctx, n.cfg, m, groups, fanPerGroup(n.cfg, sc), int64(n.cfg.prefill),
		func(g string, i int) (consumer, error) { return n.newConsumer(ctx, g, i) })
}

func (n *natsSystem) latency(ctx context.Context, m *cpuMeter) result {
	err := withAdmin(ctx, n.url, func(ctx context.Context, js jetstream.JetStream) error {
		if err := recreateStream(ctx, js, natsLatencyStream); err != nil {
			return err
		}
		// -latency-ack none: no acks, like queen's autoAck=true (at most
		// once); explicit: each message acked on receipt.
		policy := jetstream.AckExplicitPolicy
		if n.cfg.latAck == latencyAckNone {
			policy = jetstream.AckNonePolicy
		}
		_, err := js.CreateOrUpdateConsumer(ctx, natsLatencyStream, jetstream.ConsumerConfig{
			Durable:       "lat",
			AckPolicy:     policy,
			DeliverPolicy: jetstream.DeliverNewPolicy,
		})
		if err != nil {
			return fmt.Errorf("create consumer lat: %w", err)
		}
		return nil
	})
	if err != nil {
		return result{err: err}
	}
	pnc, pjs, err := connectJS(n.url, "bench-lat-producer")
	if err != nil {
		return result{err: err}
	}
	defer pnc.Close()

	startRecv := func(ctx context.Context, onMsg func([]byte)) (func() error, error) {
		nc, js, err := connectJS(n.url, "bench-lat-consumer")
		if err != nil {
			return nil, err
		}
		cons, err := js.Consumer(ctx, natsLatencyStream, "lat")
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("consumer lat: %w", err)
		}
		// Consume keeps pull requests outstanding on the server, so a stored
		// message is sent to the client at once (the pull-based push).
		explicit := n.cfg.latAck == latencyAckExplicit
		var ackErr atomic.Pointer[error] // the first failed ack, reported at the end
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			onMsg(msg.Data())
			if explicit {
				// A publish the server does not answer: it fails only
				// when the connection does.
				if err := msg.Ack(); err != nil {
					ackErr.CompareAndSwap(nil, &err)
				}
			}
		})
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("consume: %w", err)
		}
		return func() error {
			cc.Stop()
			nc.Close()
			if err := ackErr.Load(); err != nil {
				return fmt.Errorf("ack: %w", *err)
			}
			return nil
		}, nil
	}
	send := func(ctx context.Context, payload []byte) error {
		f, err := pjs.PublishAsync("bench.0", payload)
		if err != nil {
			return fmt.Errorf("publish async: %w", err)
		}
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return fmt.Errorf("publish ack: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return runLatency(ctx, n.cfg, m, startRecv, send)
}

// makePayload returns a JSON object of exactly size bytes (size >= 16):
// {"s":"xxxx…"}. The same bytes are the NATS message body and queen's payload.
func makePayload(size int) []byte {
	b := make([]byte, 0, size)
	b = append(b, `{"s":"`...)
	for len(b) < size-2 {
		b = append(b, 'a'+byte(len(b)%26))
	}
	return append(b, `"}`...)
}

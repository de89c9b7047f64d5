package transfer

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Progress counts the bytes of a copy. Its methods are safe for concurrent use.
type Progress struct {
	done  atomic.Int64
	total atomic.Int64

	mu       sync.Mutex
	lastDone int64
	lastTime time.Time
	rate     float64
}

// NewProgress returns a Progress of total bytes (0 while unknown).
func NewProgress(total int64) *Progress {
	p := &Progress{lastTime: time.Now()}
	p.total.Store(total)
	return p
}

// Add counts n more bytes done.
func (p *Progress) Add(n int64) { p.done.Add(n) }

// Update counts n more bytes done (go-qcow2reader's convert.Updater).
func (p *Progress) Update(n int64) { p.done.Add(n) }

// SetTotal sets the size of the work.
func (p *Progress) SetTotal(n int64) { p.total.Store(n) }

// Done is the bytes done so far.
func (p *Progress) Done() int64 { return p.done.Load() }

// Total is the size of the work, 0 while unknown.
func (p *Progress) Total() int64 { return p.total.Load() }

// Rate is the bytes per second over the last sampling interval.
func (p *Progress) Rate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate
}

// sample updates the rate; called periodically.
func (p *Progress) sample(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	done := p.done.Load()
	if dt := now.Sub(p.lastTime).Seconds(); dt > 0 {
		p.rate = float64(done-p.lastDone) / dt
	}
	p.lastDone, p.lastTime = done, now
}

// Collectors are the progress metrics: diskpipe_transfer_bytes_done,
// diskpipe_transfer_bytes_total and diskpipe_transfer_bytes_per_second.
func (p *Progress) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "diskpipe_transfer_bytes_done",
			Help: "Bytes of the source processed so far."}, func() float64 { return float64(p.Done()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "diskpipe_transfer_bytes_total",
			Help: "Bytes of the source in all; 0 while unknown."}, func() float64 { return float64(p.Total()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "diskpipe_transfer_bytes_per_second",
			Help: "Recent transfer rate."}, p.Rate),
	}
}

// Report samples the rate every interval and logs a progress line, until ctx ends.
func (p *Progress) Report(ctx context.Context, log *slog.Logger, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.sample(now)
			log.Info("Progress", "bytesDone", p.Done(), "bytesTotal", p.Total(), "bytesPerSecond", int64(p.Rate()))
		}
	}
}

// Serve serves p's metrics on addr at /metrics until ctx ends. It returns once listening.
func (p *Progress) Serve(ctx context.Context, addr string) (net.Addr, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(p.Collectors()...)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("Metrics server stopped", "err", err)
		}
	}()
	return l.Addr(), nil
}

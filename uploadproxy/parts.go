package uploadproxy

import (
	"bytes"
	"context"
	"sync"

	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/objectstore/uploads"
)

// PartsInFlight is how many parts of one upload are held at once: while the parts before it
// go to the store, the next is read from the client, so the network and the store work
// together. Each costs a part's buffer (PartSize).
const PartsInFlight = 2

// parts stores an upload's parts as the request reads them. Each part goes to the store
// as soon as it is read, beside the parts before it; they are committed in order — hashed,
// added to the state, the state saved — so the saved offset is always a prefix the store
// holds, as a resumed upload needs.
type parts struct {
	ctx  context.Context
	s    *Server
	u    *upload
	free chan []byte
	jobs chan *partJob
	done chan struct{}
	next int // the number of the next part read

	closing sync.Once
	mu      sync.Mutex
	err error // the first failure to store or commit a part
}

type partJob struct {
	buf    []byte
	number int
	stored chan error
	etag   string
}

// partBuffers keeps part buffers between requests: a browser sends a file in many pieces, a
// request each, which would otherwise each leave PartsInFlight buffers to the collector.
var partBuffers sync.Map // part size → *sync.Pool of []byte

func partBuffer(size int64) []byte {
	pool, _ := partBuffers.LoadOrStore(size, &sync.Pool{})
	if b, ok := pool.(*sync.Pool).Get().([]byte); ok {
		return b
	}
	return make([]byte, size)
}

func releasePartBuffer(b []byte) {
	if b == nil {
		return
	}
	if pool, ok := partBuffers.Load(int64(cap(b))); ok {
		pool.(*sync.Pool).Put(b[:cap(b)]) //nolint:staticcheck // a slice header's allocation is nothing beside the part it holds
	}
}

// storeParts begins storing u's parts after those it has; close ends it.
func (s *Server) storeParts(ctx context.Context, u *upload) *parts {
	p := &parts{ctx: ctx, s: s, u: u, free: make(chan []byte, PartsInFlight), jobs: make(chan *partJob, PartsInFlight),
		done: make(chan struct{}), next: len(u.Parts) + 1}
	for range PartsInFlight {
		p.free <- nil // a buffer is made when first needed
	}
	go p.commit()
	return p
}

// buffer is a part's buffer, once a part in flight is committed; nil when storing failed
// (failed says why) or ctx ended.
func (p *parts) buffer() []byte {
	select {
	case b := <-p.free:
		if p.failed() != nil {
			return nil
		}
		if b == nil {
			b = partBuffer(p.u.PartSize)
		}
		return b
	case <-p.done:
		return nil
	case <-p.ctx.Done():
		return nil
	}
}

// store sends b (a buffer from buffer, holding the next part) to the store.
func (p *parts) store(b []byte) {
	j := &partJob{buf: b, number: p.next, stored: make(chan error, 1)}
	p.next++
	core := minio.Core{Client: p.s.Store.Client}
	go func() {
		part, err := core.PutObjectPart(p.ctx, uploads.Bucket, p.u.key, p.u.UploadID, j.number, bytes.NewReader(b), int64(len(b)), minio.PutObjectPartOptions{})
		j.etag = part.ETag
		j.stored <- err
	}()
	p.jobs <- j
}

// commit adds the stored parts to the upload in order, until one fails or close.
func (p *parts) commit() {
	defer close(p.done)
	for j := range p.jobs {
		err := <-j.stored
		if err == nil && p.failed() == nil {
			u := p.u
			u.sum.Hash.Write(j.buf)
			u.Parts = append(u.Parts, part{Number: j.number, ETag: j.etag, Size: int64(len(j.buf))})
			u.Offset += int64(len(j.buf))
			err = p.s.save(p.ctx, u)
		}
		if err != nil {
			p.mu.Lock()
			if p.err == nil {
				p.err = err
			}
			p.mu.Unlock()
		}
		p.free <- j.buf[:cap(j.buf)]
	}
}

func (p *parts) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// close waits for the parts in flight and answers the first failure; the upload's state is
// then what the store holds.
func (p *parts) close() error {
	p.closing.Do(func() {
		close(p.jobs)
		<-p.done
		for { // the buffers back from the store (one the request read into and kept is let go)
			select {
			case b := <-p.free:
				releasePartBuffer(b)
			default:
				return
			}
		}
	})
	<-p.done
	return p.failed()
}

package uploadproxy

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/diskpipe/diskpipe/objectstore/uploads"
)

// PartsInFlight is how many parts of one upload are held at once, at most: while the part
// before it goes to the store, the next is read from the client, so the network and the store
// work together. Each costs a part's buffer (PartSize); the second is one of the proxy's
// SpareParts, when one is spare.
const PartsInFlight = 2

// storeTimeout bounds storing one part and saving the state after it. It runs apart from the
// request's context, which the server ends at the body's first failed read (a cut, a client
// too slow, a later request taking over): a part read whole is stored all the same.
const storeTimeout = 2 * time.Minute

// parts stores an upload's parts as the request reads them. Each part goes to the store
// as soon as it is read, beside the parts before it; they are committed in order — hashed,
// added to the state, the state saved — so the saved offset is always a prefix the store
// holds, as a resumed upload needs.
type parts struct {
	ctx  context.Context // the request's: reading waits on it
	bg   context.Context // storing's: the request's values, not its end
	stop context.CancelFunc
	// spare says the upload holds one of the proxy's spare parts, given back at close.
	spare bool
	s     *Server
	u     *upload
	free  chan []byte
	jobs  chan *partJob
	done  chan struct{}
	next  int // the number of the next part read

	closing sync.Once
	mu      sync.Mutex
	err     error // the first failure to store or commit a part
}

type partJob struct {
	buf    []byte
	number int
	stored chan error
	etag   string
}

// storeParts begins storing u's parts after those it has; close ends it.
func (s *Server) storeParts(ctx context.Context, u *upload) *parts {
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	p := &parts{ctx: ctx, bg: bg, stop: stop, s: s, u: u, free: make(chan []byte, PartsInFlight), jobs: make(chan *partJob, PartsInFlight),
		done: make(chan struct{}), next: len(u.Parts) + 1}
	p.free <- nil // a buffer is taken when first needed
	select {
	case s.spare <- struct{}{}:
		p.spare = true
		p.free <- nil
	default: // none spare: one part at a time
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
			b = make([]byte, p.u.PartSize)
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
		ctx, cancel := context.WithTimeout(p.bg, storeTimeout)
		defer cancel()
		part, err := core.PutObjectPart(ctx, uploads.Bucket, p.u.key, p.u.UploadID, j.number, bytes.NewReader(b), int64(len(b)), minio.PutObjectPartOptions{})
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
			ctx, cancel := context.WithTimeout(p.bg, storeTimeout)
			err = p.s.save(ctx, u)
			cancel()
		}
		if err != nil {
			p.mu.Lock()
			if p.err == nil {
				p.err = err
			}
			p.mu.Unlock()
			// A failed PUT's transport may read its body still: that buffer is not reused.
			p.free <- nil
			continue
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
		p.stop()
		if p.spare {
			<-p.s.spare
		}
	})
	<-p.done
	return p.failed()
}

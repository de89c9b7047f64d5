package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// keepAlive is how often a quiet stream says it is alive, so that proxies keep it open.
const keepAlive = 15 * time.Second

// A stream ends after watchLifetime (and up to a fifth more, drawn, so that a console's
// streams do not all come back at once), and a client that reads nothing of it for
// 2 × keepAlive loses it; a user has at most maxWatches streams at once.
const (
	watchLifetime = 10 * time.Minute
	maxWatches    = 16
)

// watchSlots counts the streams open, by user.
type watchSlots struct {
	mu     sync.Mutex
	byUser map[string]int
}

// take counts one more stream of user, or says they have as many as they may.
func (w *watchSlots) take(user string) (release func(), ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byUser == nil {
		w.byUser = map[string]int{}
	}
	if w.byUser[user] >= maxWatches {
		return nil, false
	}
	w.byUser[user]++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.byUser[user]--; w.byUser[user] == 0 {
			delete(w.byUser, user)
		}
	}, true
}

// change is one event of a watch's stream: what changed, so a page reads its list again.
type change struct {
	Type      string `json:"type"`
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// watch answers ?watch=true with a stream of server-sent events, one `change` per change to
// the resource's objects the caller may watch (an apiserver watch as the caller), until the
// client goes or the apiserver ends the watch (the client then asks again). A kind the
// caller may not watch is left out, and said in the first event; none of them: 403.
func (s *Server) watch(ctx context.Context, c *call) (int, envelope, error) {
	release, ok := s.watches.take(c.user.Username)
	if !ok {
		return 0, envelope{}, fail(http.StatusTooManyRequests, "TooManyRequests", "%s has %d watches open, as many as the gateway keeps for one user: close a console's tab", c.user.Username, maxWatches)
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, watchLifetime+rand.N(watchLifetime/5))
	defer cancel()
	var ws []watch.Interface
	var left []string
	for _, k := range c.kinds {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(k.gvk.GroupVersion().WithKind(k.gvk.Kind + "List"))
		wi, err := c.cl.AsCaller.Watch(ctx, l, client.InNamespace(c.namespace))
		if apierrors.IsForbidden(err) {
			left = append(left, denyReason(c.user.Username, "watch", k, c.namespace))
			if len(left) == len(c.kinds) {
				return 0, envelope{}, refusal(err, c.user.Username, "watch", k, c.namespace)
			}
			continue
		} else if err != nil {
			return 0, envelope{}, refusal(err, c.user.Username, "watch", k, c.namespace)
		}
		defer wi.Stop()
		ws = append(ws, wi)
	}
	w := c.w
	rc := http.NewResponseController(w)
	// A stream outlives the server's read and write timeouts, meant for the API's requests;
	// each write has its own deadline instead, so a client that stops reading frees it.
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Now().Add(2 * keepAlive))
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no") // nginx ingresses: pass each event on at once
	w.Header().Set(HeaderTraceID, c.trace)
	w.WriteHeader(http.StatusOK)
	ready, _ := json.Marshal(map[string]string{"message": strings.Join(left, "; ")})
	if _, err := fmt.Fprintf(w, "retry: 3000\nevent: ready\ndata: %s\n\n", ready); err != nil {
		return answered, envelope{}, nil
	}
	_ = rc.Flush()
	events := make(chan change)
	for _, wi := range ws {
		go func() {
			for ev := range wi.ResultChan() {
				ch := change{Type: string(ev.Type)}
				if o, ok := ev.Object.(*unstructured.Unstructured); ok {
					ch.Kind, ch.Namespace, ch.Name = o.GetKind(), o.GetNamespace(), o.GetName()
				}
				select {
				case events <- ch:
				case <-ctx.Done():
					return
				}
			}
			select { // the apiserver ended the watch: so does the stream
			case events <- change{Type: "closed"}:
			case <-ctx.Done():
			}
		}()
	}
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return answered, envelope{}, nil
		case ch := <-events:
			if ch.Type == "closed" {
				return answered, envelope{}, nil
			}
			data, _ := json.Marshal(ch)
			_ = rc.SetWriteDeadline(time.Now().Add(2 * keepAlive))
			_, err = fmt.Fprintf(w, "event: change\ndata: %s\n\n", data)
		case <-tick.C:
			_ = rc.SetWriteDeadline(time.Now().Add(2 * keepAlive))
			_, err = fmt.Fprint(w, ": alive\n\n")
		}
		if err != nil || rc.Flush() != nil {
			return answered, envelope{}, nil
		}
	}
}

package exporter

import (
	"context"
	"sync"
)

// ordered runs fn for jobs 0..n-1 on workers goroutines and hands their results to consume
// in job order. At most 2 × workers results wait for their turn, which bounds memory.
func ordered[R any](ctx context.Context, n, workers int, fn func(i int) (R, error), consume func(R) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		r   R
		err error
	}
	futures := make(chan chan result, 2*workers)
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	go func() {
		defer close(futures)
		for i := 0; i < n; i++ {
			ch := make(chan result, 1)
			select {
			case futures <- ch:
			case <-ctx.Done():
				return
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				r, err := fn(i)
				ch <- result{r, err}
			}()
		}
	}()
	var err error
	for ch := range futures {
		res := <-ch
		if err == nil {
			err = res.err
			if err == nil {
				err = consume(res.r)
			}
			if err != nil {
				cancel()
			}
		}
	}
	wg.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return err
}

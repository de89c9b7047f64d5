package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// errFailed is an object that failed for good: the plugin exits 1 with it.
type errFailed struct{ s state }

func (e *errFailed) Error() string {
	msg := fmt.Sprintf("%s/%s failed: %s: %s", e.s.Kind, e.s.Name, e.s.Reason, e.s.Message)
	if e.s.Advice != "" {
		msg += "\nWhat to do: " + e.s.Advice
	}
	return msg
}

// describe prints an object's state once.
func (o *options) describe(ctx context.Context, c *client, r ref) error {
	obj, err := c.get(ctx, r)
	if err != nil {
		return err
	}
	s := stateOf(r, obj)
	if o.output == "json" {
		return json.NewEncoder(o.streams.Out).Encode(s)
	}
	fmt.Fprintf(o.streams.Out, "%s\n", s)
	if s.Advice != "" {
		fmt.Fprintf(o.streams.Out, "What to do: %s\n", s.Advice)
	}
	return nil
}

// wait polls an object until it is Ready or failed, showing its progress, and returns its
// last state; a failure is an *errFailed.
func (o *options) wait(ctx context.Context, c *client, r ref) (state, error) {
	bar := newBar(o.streams.ErrOut, r.String())
	defer bar.finish()
	last := ""
	for {
		obj, err := c.get(ctx, r)
		if err != nil {
			if ctx.Err() != nil {
				return state{}, fmt.Errorf("%s not done within --timeout (%s)", r, o.timeout)
			}
			return state{}, err
		}
		s := stateOf(r, obj)
		if s.BytesTotal > 0 && !s.done() {
			bar.show(s.BytesDone, s.BytesTotal, s.Phase)
		} else if line := s.String(); line != last {
			bar.line(line)
			last = line
		}
		if s.done() {
			bar.finish()
			if o.output == "json" {
				if err := json.NewEncoder(o.streams.Out).Encode(s); err != nil {
					return s, err
				}
			} else if s.Phase == "Ready" {
				fmt.Fprintf(o.streams.Out, "%s\n", s)
			}
			if s.Phase == "Failed" {
				return s, &errFailed{s}
			}
			return s, nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return s, fmt.Errorf("%s not done within --timeout (%s): %s", r, o.timeout, s)
			}
			return s, ctx.Err()
		case <-time.After(o.interval):
		}
	}
}

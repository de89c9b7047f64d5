package testenv

import (
	"fmt"
	"strconv"
	"strings"
)

// SumCounter sums a counter's samples, all its labels, over pages of Prometheus' text format
// (what several runs of a process served).
func SumCounter(pages []string, name string) (float64, error) {
	total := 0.0
	for _, t := range pages {
		for line := range strings.Lines(t) {
			if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
				continue
			}
			fields := strings.Fields(line)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q: %w", name, line, err)
			}
			total += v
		}
	}
	return total, nil
}

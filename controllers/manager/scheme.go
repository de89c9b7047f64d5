package manager

import (
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/diskpipe/diskpipe/internal/scheme"
)

// NewScheme returns a scheme with every kind diskpipe reads or writes (scheme.New).
func NewScheme() *runtime.Scheme { return scheme.New() }

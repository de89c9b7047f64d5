// Package contract is what the manager and the pods it runs agree on: one Go type per pod
// kind (Import for the importer, Export for the exporter, both with Pod's flags), which the
// controllers fill and turn into a command line (Args), and the binaries parse back into the
// same type (Bind). A field added here is on both sides at once; TestRoundTrip sends every
// field of every type through a command line and back.
//
// The command line stays one a person reads: --name value, in the order of the type's fields,
// with only the fields set (a zero field is not passed, and the binary's default applies; a
// field whose zero is a value of its own, such as an overhead of 0, is a pointer).
package contract

import (
	"flag"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Pod are the flags of every transfer pod (transfer.Command reads them).
type Pod struct {
	MetricsAddr            string        `flag:"metrics-addr" usage:"where progress metrics are served (empty: nowhere)"`
	ProgressInterval       time.Duration `flag:"progress-interval" usage:"how often progress is logged"`
	TerminationMessagePath string        `flag:"termination-message-path" usage:"where the JSON result is written (empty: nowhere)"`
	MemoryLimit            int64         `flag:"memory-limit" usage:"soft limit of the Go heap in bytes"`
	ForbidCIDR             []string      `flag:"forbid-cidr" usage:"a network the pod may not connect to, e.g. the cluster's pod or service CIDR (repeatable)"`
	AllowDestination       []string      `flag:"allow-destination" usage:"a CIDR, address or host name that may be connected to even where refused by default (repeatable)"`
	ConnectTo              []string      `flag:"connect-to" usage:"host:port=address:port: dial address:port for host:port, a server the manager vouches for (repeatable)"`
}

// DefaultPod is what a pod does with no flag given.
func DefaultPod(memoryLimit int64) Pod {
	return Pod{MetricsAddr: ":8090", ProgressInterval: 5 * time.Second, TerminationMessagePath: "/dev/termination-log", MemoryLimit: memoryLimit}
}

// S3 names an object of an S3 store and how to reach it.
type S3 struct {
	Endpoint       string `flag:"endpoint" usage:"s3: the store's URL"`
	Region         string `flag:"region" usage:"s3: the bucket's region"`
	BucketLookup   string `flag:"bucket-lookup" usage:"s3: Auto, Path or VirtualHost"`
	Bucket         string `flag:"bucket" usage:"s3: the bucket"`
	Object         string `flag:"object" usage:"s3: the object"`
	CredentialsDir string `flag:"s3-credentials-dir" usage:"s3: directory with the files accessKeyId and secretAccessKey (a mounted Secret)"`
}

// Bind defines a flag of fs for every field of the struct v points to that has a flag tag
// (and those of the structs it holds), each with the field's value as its default.
func Bind(fs *flag.FlagSet, v any) {
	each(reflect.ValueOf(v).Elem(), func(name, usage string, f reflect.Value) {
		switch p := f.Addr().Interface().(type) {
		case *string:
			fs.StringVar(p, name, *p, usage)
		case *bool:
			fs.BoolVar(p, name, *p, usage)
		case *int:
			fs.IntVar(p, name, *p, usage)
		case *int64:
			fs.Int64Var(p, name, *p, usage)
		case *float64:
			fs.Float64Var(p, name, *p, usage)
		case **float64:
			fs.Func(name, usage, func(s string) error {
				v, err := strconv.ParseFloat(s, 64)
				*p = &v
				return err
			})
		case *time.Duration:
			fs.DurationVar(p, name, *p, usage)
		case *[]string:
			fs.Func(name, usage, func(s string) error { *p = append(*p, s); return nil })
		default:
			panic(fmt.Sprintf("contract: flag %s has a type Bind does not know: %s", name, f.Type()))
		}
	})
}

// Args is the command line that gives a binary v's fields: each field that is not zero, as
// --name value (a true bool as --name, a list as --name value per item).
func Args(v any) []string {
	var args []string
	each(reflect.ValueOf(v), func(name, _ string, f reflect.Value) {
		if f.IsZero() {
			return
		}
		flag := "--" + name
		switch x := f.Interface().(type) {
		case string:
			args = append(args, flag, x)
		case bool:
			args = append(args, flag)
		case int:
			args = append(args, flag, strconv.Itoa(x))
		case int64:
			args = append(args, flag, strconv.FormatInt(x, 10))
		case float64:
			args = append(args, flag, strconv.FormatFloat(x, 'g', -1, 64))
		case *float64:
			args = append(args, flag, strconv.FormatFloat(*x, 'g', -1, 64))
		case time.Duration:
			args = append(args, flag, x.String())
		case []string:
			for _, s := range x {
				args = append(args, flag, s)
			}
		default:
			panic(fmt.Sprintf("contract: flag %s has a type Args does not know: %s", name, f.Type()))
		}
	})
	return args
}

// each calls fn for every field of struct v with a flag tag, in order, going into the
// struct fields it holds.
func each(v reflect.Value, fn func(name, usage string, f reflect.Value)) {
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	t := v.Type()
	for i := range t.NumField() {
		sf, f := t.Field(i), v.Field(i)
		name := sf.Tag.Get("flag")
		switch {
		case name != "":
			fn(name, strings.TrimSpace(sf.Tag.Get("usage")), f)
		case sf.Type.Kind() == reflect.Struct && sf.Type != reflect.TypeFor[time.Time]():
			each(f, fn)
		}
	}
}

// Overlay sets on the struct dst points to every field of src that is set (not zero): a
// scalar replaces dst's, a list is appended to dst's. Parts of one command line made in
// different places (a source's flags, a mode's) come together so.
func Overlay[T any](dst *T, src T) {
	d := reflect.ValueOf(dst).Elem()
	var fields []reflect.Value
	each(d, func(_, _ string, f reflect.Value) { fields = append(fields, f) })
	i := 0
	each(reflect.ValueOf(src), func(_, _ string, f reflect.Value) {
		to := fields[i]
		i++
		switch {
		case f.IsZero():
		case f.Kind() == reflect.Slice:
			to.Set(reflect.AppendSlice(to, f))
		default:
			to.Set(f)
		}
	})
}

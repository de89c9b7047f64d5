// Command pause is the real cluster's sandbox ("pause") image: it holds a pod's namespaces and
// does nothing until it is told to stop. No pause image can be pulled here, so the harness
// builds this one (make pause-image). The harness also runs it as PID 1 of each node's own PID
// namespace (test/cluster, nodeNamespace).
//
// Two more modes let specs probe the cluster's network without a shell in any image:
// "pause serve ADDR" answers every HTTP request with $NODE_NAME, and "pause get URL" fetches URL
// and ends with its body as the container's termination message, succeeding on 200 only.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 3 {
		switch os.Args[1] {
		case "serve":
			serve(os.Args[2])
			return
		case "get":
			os.Exit(get(os.Args[2]))
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1, reap the children that others leave behind (a pod's containers sharing its PID
	// namespace; on the node, the shims containerd starts).
	child := make(chan os.Signal, 1)
	signal.Notify(child, syscall.SIGCHLD)
	for {
		select {
		case <-sig:
			return
		case <-child:
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}

func serve(addr string) {
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, os.Getenv("NODE_NAME")) })}
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func get(url string) int {
	msg, code := "", 1
	c := &http.Client{Timeout: 20 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		msg = err.Error()
	} else {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		msg = fmt.Sprintf("%d %s", resp.StatusCode, body)
		if resp.StatusCode == http.StatusOK {
			code = 0
		}
	}
	fmt.Println(msg)
	_ = os.WriteFile("/dev/termination-log", []byte(msg), 0o644)
	return code
}

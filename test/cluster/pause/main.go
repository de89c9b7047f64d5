// Command pause is the real cluster's sandbox ("pause") image: it holds a pod's namespaces and
// does nothing until it is told to stop. No pause image can be pulled here, so the harness
// builds this one (make pause-image). The harness also runs it as PID 1 of each node's own PID
// namespace (test/cluster, nodeNamespace).
//
// More modes let specs probe the cluster's network without a shell in any image:
// "pause serve ADDR" answers every HTTP request with $NODE_NAME; "pause get URL" fetches URL
// and ends with its body as the container's termination message, succeeding on 200 only (an
// https server's certificate unchecked); and
// "pause hold ADDR N", a hostile client, keeps N connections to ADDR open, sending nothing on
// them and opening another whenever the server ends one, and tells in its log, each 5 s, how
// many are open and how the server ended the others (closed, or answered with a status line).
package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 4 && os.Args[1] == "hold" {
		n, err := strconv.Atoi(os.Args[3])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		hold(os.Args[2], n)
		return
	}
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
	// A probe of reachability: an https server's certificate is not checked.
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // reachability only
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

// hold keeps n connections to addr open, as a hostile client would: it sends nothing on them,
// and opens another whenever the server ends one, reporting each 5 s.
func hold(addr string, n int) {
	var mu sync.Mutex
	ended := map[string]int{} // how: "closed" or the status line
	open := 0
	one := func() {
		for {
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			if err != nil {
				mu.Lock()
				ended["not connected"]++
				mu.Unlock()
				time.Sleep(time.Second)
				continue
			}
			mu.Lock()
			open++
			mu.Unlock()
			line, _ := bufio.NewReader(c).ReadString('\n')
			c.Close()
			how := "closed"
			if line = strings.TrimSpace(line); line != "" {
				how = "answered " + line
			}
			mu.Lock()
			open--
			ended[how]++
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}
	for range n {
		go one()
	}
	for {
		time.Sleep(5 * time.Second)
		mu.Lock()
		fmt.Printf("held %d of %d open; ended: %v\n", open, n, ended)
		mu.Unlock()
	}
}

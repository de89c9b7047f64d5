package bootdisk

import (
	"fmt"
	"io"
)

// cpio writes a newc ("070701") archive, the format the kernel unpacks as an initramfs:
// every entry is owned by root, timestamps are 0, so the archive is reproducible.
type cpio struct {
	w   io.Writer
	ino int
	err error
}

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeChar = 0o020000
)

func (c *cpio) dir(name string)                         { c.entry(name, modeDir|0o755, 0, 0, nil) }
func (c *cpio) file(name string, perm int, data []byte) { c.entry(name, modeFile|perm, 0, 0, data) }
func (c *cpio) device(name string, major, minor int) {
	c.entry(name, modeChar|0o600, major, minor, nil)
}
func (c *cpio) trailer() { c.entry("TRAILER!!!", 0, 0, 0, nil) }

func (c *cpio) entry(name string, mode, major, minor int, data []byte) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := 1
	if mode&modeDir != 0 {
		nlink = 2
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor, rdevmajor,
	// rdevminor, namesize, check; then the name (NUL-terminated) and the data, each padded to 4.
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, major, minor, len(name)+1, 0)
	c.write([]byte(hdr + name + "\x00"))
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
}

func (c *cpio) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

func (c *cpio) pad(n int) { c.write(make([]byte, (4-n%4)%4)) }

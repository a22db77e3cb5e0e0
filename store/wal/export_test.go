package wal

import "github.com/participantd/participantd/store/vfs"

func osFS() vfs.FS { return vfs.OS }

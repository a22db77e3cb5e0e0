package server

import (
	"testing"

	"github.com/participantd/participantd/store/logfirst"
)

// The offline tools find the bbolt file by StoreFile; the store writes it
// as logfirst.DBFile.
func TestStoreFile_IsTheLogFirstStoresFile(t *testing.T) {
	if StoreFile != logfirst.DBFile {
		t.Fatalf("StoreFile = %q, logfirst.DBFile = %q", StoreFile, logfirst.DBFile)
	}
}

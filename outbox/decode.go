package outbox

import (
	"errors"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/participantd/participantd/oplog"
)

// errFields reports an array-encoded row or record whose length is not its
// number of fields, as msgpack's reflective decoder refuses it.
var errFields = errors.New("number of fields in an array-encoded row or record differs")

// Fields of the array form Encode writes.
const (
	rowFields    = 5
	recordFields = 5
)

// preallocLimit bounds the elements a declared array length allocates
// before they are read: a length the bytes do not hold costs no more.
const preallocLimit = 1024

// DecodeMsgpack implements msgpack.CustomDecoder. It reads the array form
// Encode writes through the Decoder's own readers instead of by
// reflection, which allocated about fifteen times a row: a checkpoint of
// a conversation retaining tens of thousands of records decodes as many
// rows (loadRetained), and that garbage was most of what a deaf
// recipient's server grew by at every checkpoint. It accepts exactly what
// the reflective decoder accepts of the array form (FuzzDecode_AsReflection),
// and refuses the map form, which Encode never writes.
func (r *Row) DecodeMsgpack(d *msgpack.Decoder) error {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n <= 0 {
		*r = Row{}
		return nil
	}
	if n != rowFields {
		return errFields
	}
	var row Row
	kind, err := d.DecodeUint64()
	if err != nil {
		return err
	}
	row.Kind = RowKind(kind)
	if row.Source, err = d.DecodeUint64(); err != nil {
		return err
	}
	if row.Records, err = decodeRecords(d); err != nil {
		return err
	}
	p, err := d.DecodeUint64()
	if err != nil {
		return err
	}
	row.Participant = oplog.ParticipantID(p)
	through, err := d.DecodeUint64()
	if err != nil {
		return err
	}
	row.Through = oplog.Seq(through)
	*r = row
	return nil
}

func decodeRecords(d *msgpack.Decoder) ([]Record, error) {
	n, err := d.DecodeArrayLen()
	if err != nil || n == -1 {
		return nil, err
	}
	out := make([]Record, 0, min(n, preallocLimit))
	for range n {
		var rec Record
		if err := decodeRecord(d, &rec); err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

func decodeRecord(d *msgpack.Decoder, rec *Record) error {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return err
	}
	if n <= 0 {
		return nil
	}
	if n != recordFields {
		return errFields
	}
	seq, err := d.DecodeUint64()
	if err != nil {
		return err
	}
	rec.Seq = oplog.Seq(seq)
	kind, err := d.DecodeUint64()
	if err != nil {
		return err
	}
	rec.Kind = RecordKind(kind)
	p, err := d.DecodeUint64()
	if err != nil {
		return err
	}
	rec.Participant = oplog.ParticipantID(p)
	cause, err := d.DecodeUint64()
	if err != nil {
		return err
	}
	rec.Cause = oplog.Cause(cause)
	m, err := d.DecodeArrayLen()
	if err != nil || m == -1 {
		return err
	}
	rec.Recipients = make([]oplog.ParticipantID, 0, min(m, preallocLimit))
	for range m {
		q, err := d.DecodeUint64()
		if err != nil {
			return err
		}
		rec.Recipients = append(rec.Recipients, oplog.ParticipantID(q))
	}
	return nil
}

module github.com/participantd/participantd

go 1.26.8

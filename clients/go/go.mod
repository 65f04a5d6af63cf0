module permit.dev/go/permit

go 1.19

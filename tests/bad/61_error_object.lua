-- expect: 61_error_object\.lua:3: \(error object is a table value\)
-- An error raised with a table.
error({code = 42})

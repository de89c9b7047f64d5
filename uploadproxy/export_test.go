package uploadproxy

// CDIToken answers a CDI UploadTokenRequest as the aggregated API does, for tests.
var CDIToken = (*TokenAPI).cdiToken

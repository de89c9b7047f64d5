package uploadproxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// TestReviewsBounded: a token sent again is not reviewed again while its answer is kept, and
// a flood of made-up tokens costs the apiserver at most the burst, then 429 (one step, with a
// fake client that plays the apiserver's TokenReview).
func TestReviewsBounded(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := authenticationv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	asked := 0
	c := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			tr := obj.(*authenticationv1.TokenReview)
			asked++
			if tr.Spec.Token == "good" {
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "alice"}}
			} else {
				tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
			}
			return nil
		}}).Build()
	v := newReviews(c, nil)
	for range 100 {
		if u, err := v.user(t.Context(), "good"); err != nil || u.Username != "alice" {
			t.Fatalf("good: %v %v", u, err)
		}
		if _, err := v.user(t.Context(), "x"); StatusOf(err) != http.StatusUnauthorized {
			t.Fatalf("x: %v", err)
		}
	}
	if asked != 2 {
		t.Errorf("%d reviews for two tokens sent 100 times each", asked)
	}
	refused := 0
	for i := range 1000 {
		_, err := v.user(t.Context(), fmt.Sprintf("made-up-%d", i))
		if StatusOf(err) == http.StatusTooManyRequests {
			refused++
		} else if StatusOf(err) != http.StatusUnauthorized {
			t.Fatalf("made-up token: %v", err)
		}
	}
	if asked > 2+reviewBurst+reviewRate || refused < 900 {
		t.Errorf("1,000 made-up tokens: %d reviews, %d refused with 429", asked-2, refused)
	}
	if u, err := v.user(t.Context(), "good"); err != nil || u.Username != "alice" {
		t.Errorf("a kept answer during the flood: %v %v", u, err)
	}
	// Through the proxy, the refusal says when to come back.
	s := &Server{Kube: c}
	s.reviewsOnce.Do(func() { s.reviews = v })
	req := httptest.NewRequest(http.MethodPut, "/v1/namespaces/vms/virtualmachineimages/disk", nil)
	req.Header.Set("Authorization", "Bearer one-more")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Errorf("a request over the rate: %d, Retry-After %q: %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}

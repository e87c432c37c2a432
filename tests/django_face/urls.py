from django.contrib import admin
from django.urls import path

from .testapp import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/<str:number>/", views.place_order),
    path("streams/<str:stream>/", views.append_to_stream),
    path("api/events/", views.EventList.as_view()),
    path("api/events-by-cursor/", views.EventCursorList.as_view()),
    path("api/events/<str:pk>/", views.EventDetail.as_view()),
]

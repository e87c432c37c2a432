from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from . import views

urlpatterns = [
    path("", views.order_list, name="order-list"),
    path("orders/new/", views.order_new, name="order-new"),
    path("orders/<str:number>/", views.order_detail, name="order-detail"),
    path("orders/<str:number>/<str:action>/", views.order_action, name="order-action"),
    path("api/orders/", csrf_exempt(views.api_orders), name="api-orders"),
    path("api/read-models/", views.api_read_models, name="api-read-models"),
    path("api/orders/<str:number>/", views.api_order, name="api-order"),
    path("api/orders/<str:number>/<str:action>/", csrf_exempt(views.api_order_action), name="api-order-action"),
]
